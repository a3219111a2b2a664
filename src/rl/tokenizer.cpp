#include "src/rl/tokenizer.h"

#include <array>
#include <stdexcept>

namespace rlf {

namespace {

// Character -> token id, built once at compile time so encoding is a table lookup.
constexpr std::array<int, 256> make_token_table() {
  std::array<int, 256> table{};
  for (int& id : table) id = -1;
  for (size_t i = 0; i < Tokenizer::kAlphabet.size(); ++i) {
    table[static_cast<unsigned char>(Tokenizer::kAlphabet[i])] = Tokenizer::kFirstChar + int(i);
  }
  return table;
}

constexpr std::array<int, 256> kTokenOf = make_token_table();

// Stands in for an id the alphabet does not cover (a model whose vocabulary is larger than the
// tokenizer's can sample one). It is outside the alphabet, so no task's parser accepts it and a
// response containing it can never be scored as correct.
constexpr char kUnknownChar = '?';

std::string describe(char c) {
  const auto byte = static_cast<unsigned char>(c);
  if (byte >= 0x20 && byte < 0x7f) return "'" + std::string(1, c) + "'";
  constexpr char kHex[] = "0123456789abcdef";
  return std::string("byte 0x") + kHex[byte >> 4] + kHex[byte & 15];
}

}  // namespace

int Tokenizer::token_of(char c) {
  return kTokenOf[static_cast<unsigned char>(c)];
}

std::vector<int> Tokenizer::encode(std::string_view text) {
  std::vector<int> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const int id = token_of(text[i]);
    if (id < 0) {
      throw std::invalid_argument("tokenizer: character " + describe(text[i]) + " at position " +
                                  std::to_string(i) + " is not in the alphabet \"" +
                                  std::string(kAlphabet) + "\"");
    }
    ids.push_back(id);
  }
  return ids;
}

std::string Tokenizer::decode(const std::vector<int>& ids) {
  std::string text;
  text.reserve(ids.size());
  for (const int id : ids) {
    if (id == kEos) break;
    if (id == kPad || id == kBos) continue;
    const bool in_alphabet = id >= kFirstChar && id < vocab_size();
    text.push_back(in_alphabet ? kAlphabet[size_t(id - kFirstChar)] : kUnknownChar);
  }
  return text;
}

}  // namespace rlf
