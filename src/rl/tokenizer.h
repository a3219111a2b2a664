// The character-level tokenizer every task shares. Token ids: 0 <pad>, 1 <bos>, 2 <eos>, then one
// id per character of kAlphabet. A prompt is encoded as <bos> + characters; a response as
// characters + <eos>.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rlf {

class Tokenizer {
 public:
  static constexpr int kPad = 0, kBos = 1, kEos = 2, kFirstChar = 3;
  // Digits, the symbols tasks use, and ten letters: 31 tokens in all, so the tiny model
  // (vocab_size 32) can run every task.
  static constexpr std::string_view kAlphabet = "0123456789+-=,:|> abcdefghij";

  static constexpr int vocab_size() { return kFirstChar + int(kAlphabet.size()); }
  // Throws std::invalid_argument naming the character that is not in the alphabet.
  static std::vector<int> encode(std::string_view text);
  // Characters of the ids; special tokens are dropped; decoding stops at the first <eos>.
  static std::string decode(const std::vector<int>& ids);
  static int token_of(char c);  // -1 when c is not in the alphabet
};

}  // namespace rlf
