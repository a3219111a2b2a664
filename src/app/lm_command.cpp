// `rlfusion lm`: supervised next-token training of the MoE model on the seeded reversal corpus,
// then greedy KV-cache generation on held-out prompts. The single-rank job that exists before
// the RL commands; it exercises every kernel, the optimizer, generation and parameter files.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kernels/arena.h"
#include "kernels/device.h"
#include "kernels/error.h"
#include "src/app/build_info.h"
#include "src/app/commands.h"
#include "src/app/options.h"
#include "src/app/reversal_corpus.h"
#include "src/io/parameter_file.h"
#include "src/model/generation.h"
#include "src/model/lr_schedule.h"
#include "src/model/optimizer.h"
#include "src/model/sequence_loss.h"
#include "src/model/transformer.h"

namespace rlf {

namespace {

struct LmOptions {
  int steps = 300;
  int batch = 32;
  float learning_rate = 3e-3f;
  int warmup_steps = 20;
  float final_lr_fraction = 0.1f;
  float weight_decay = 0.0f;
  float max_grad_norm = 1.0f;
  int min_digits = 3;
  int max_digits = 8;
  int eval_prompts = 128;
  int log_every = 25;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Packs `batch` training sequences; targets are the next tokens, weighted on the answer only.
struct PackedBatch {
  std::vector<int> inputs, targets, offsets{0};
  std::vector<float> weights;
  int answer_tokens = 0;
};

PackedBatch make_batch(const ReversalCorpus& corpus, int64_t first_id, int batch) {
  PackedBatch b;
  for (int i = 0; i < batch; ++i) {
    std::vector<int> seq = corpus.prompt(first_id + i);
    const int prompt_len = int(seq.size());
    const std::vector<int> answer = corpus.answer(first_id + i);
    seq.insert(seq.end(), answer.begin(), answer.end());
    for (size_t t = 0; t + 1 < seq.size(); ++t) {
      b.inputs.push_back(seq[t]);
      b.targets.push_back(seq[t + 1]);
      const bool is_answer = int(t) + 1 >= prompt_len;
      b.weights.push_back(is_answer ? 1.0f : 0.0f);
      b.answer_tokens += is_answer;
    }
    b.offsets.push_back(int(b.inputs.size()));
  }
  for (float& w : b.weights) w /= float(b.answer_tokens);
  return b;
}

void validate(const LmOptions& o, const ModelConfig& model) {
  auto require = [](bool ok, const std::string& message) {
    if (!ok) throw ConfigError(message);
  };
  require(o.steps >= 0, "--steps must be >= 0, got " + std::to_string(o.steps));
  require(o.batch > 0, "--batch must be > 0, got " + std::to_string(o.batch));
  require(o.learning_rate > 0, "--learning-rate must be > 0");
  require(o.warmup_steps >= 0, "--warmup-steps must be >= 0");
  require(o.final_lr_fraction >= 0 && o.final_lr_fraction <= 1,
          "--final-lr-fraction must be in [0, 1]");
  require(o.min_digits >= 1 && o.max_digits >= o.min_digits,
          "--min-digits and --max-digits must satisfy 1 <= min <= max");
  require(o.eval_prompts >= 0, "--eval-prompts must be >= 0");
  require(o.log_every > 0, "--log-every must be > 0");
  require(model.vocab_size >= ReversalCorpus::kVocabularyNeeded,
          "model '" + model.name + "' has vocab_size " + std::to_string(model.vocab_size) +
              "; the reversal corpus needs at least " +
              std::to_string(ReversalCorpus::kVocabularyNeeded));
  const int longest = 2 * o.max_digits + 3;
  require(model.max_seq_len >= longest,
          "--max-digits " + std::to_string(o.max_digits) + " needs sequences of " +
              std::to_string(longest) + " tokens but model '" + model.name + "' has max_seq_len " +
              std::to_string(model.max_seq_len));
}

}  // namespace

int run_lm_command(const std::vector<std::string>& args) {
  RunOptions run;
  LmOptions o;
  po::options_description description = run_options_description(run);
  po::options_description lm("lm options");
  lm.add_options()("steps", po::value(&o.steps)->default_value(o.steps), "optimizer steps")(
      "batch", po::value(&o.batch)->default_value(o.batch), "sequences per step")(
      "learning-rate", po::value(&o.learning_rate)->default_value(o.learning_rate),
      "peak AdamW learning rate")("warmup-steps",
                                  po::value(&o.warmup_steps)->default_value(o.warmup_steps),
                                  "linear warm-up steps")(
      "final-lr-fraction", po::value(&o.final_lr_fraction)->default_value(o.final_lr_fraction),
      "cosine decay ends at this fraction of the peak")(
      "weight-decay", po::value(&o.weight_decay)->default_value(o.weight_decay), "AdamW")(
      "max-grad-norm", po::value(&o.max_grad_norm)->default_value(o.max_grad_norm),
      "global-norm clipping (0 disables)")(
      "min-digits", po::value(&o.min_digits)->default_value(o.min_digits), "shortest string")(
      "max-digits", po::value(&o.max_digits)->default_value(o.max_digits), "longest string")(
      "eval-prompts", po::value(&o.eval_prompts)->default_value(o.eval_prompts),
      "held-out prompts for the final accuracy")(
      "log-every", po::value(&o.log_every)->default_value(o.log_every), "steps per progress line");
  description.add(lm);
  if (!parse_options("lm", args, description, run)) return 0;
  const ModelConfig config = load_model_config(run.model);
  validate(o, config);

  Device accelerator(run.backend_kind(), run.device_memory_bytes(), resolve_threads(run.threads));
  Arena& device = accelerator.memory();
  Transformer<float> model(config, accelerator.ops(), device, /*with_gradients=*/true);
  model.initialize(run.seed);
  AdamWHyper hyper;
  hyper.learning_rate = o.learning_rate;
  hyper.weight_decay = o.weight_decay;
  AdamW<float> optimizer(model, hyper, o.max_grad_norm);
  ReversalCorpus corpus{run.seed, o.min_digits, o.max_digits};
  std::filesystem::create_directories(run.run_dir);

  std::printf("# rlfusion lm: %s\n", build_info().c_str());
  std::printf(
      "# model %s: %.2fM parameters (%.2fM active per token), %d layers, %d experts top-%d\n",
      config.name.c_str(), config.parameter_count() / 1e6, config.active_parameter_count() / 1e6,
      config.n_layers, config.n_experts, config.top_k);
  std::printf("# %s, seed %llu, run dir %s\n", accelerator.describe().c_str(),
              (unsigned long long)run.seed, run.run_dir.c_str());
  std::printf("# %6s %10s %8s %10s %12s %12s\n", "step", "loss", "aux", "grad-norm", "tokens/s",
              "device-peak");
  std::fflush(stdout);

  const auto train_start = Clock::now();
  auto window_start = train_start;
  int64_t window_tokens = 0, total_tokens = 0;
  float loss = 0;
  for (int step = 1; step <= o.steps; ++step) {
    const PackedBatch batch = make_batch(corpus, int64_t(step - 1) * o.batch, o.batch);
    const int N = int(batch.inputs.size()), V = config.vocab_size;
    model.zero_gradients();
    const float* logits = model.forward(batch.inputs.data(), batch.offsets.data(), o.batch);
    float* dlogits = device.allocate<float>(size_t(N) * V, "loss gradient");
    std::fill(dlogits, dlogits + int64_t(N) * V, 0.0f);
    loss = weighted_nll(model.ops(), device, logits, batch.targets.data(), batch.weights.data(), N,
                        V, dlogits);
    const float aux = model.aux_loss() / float(config.n_layers);
    model.backward(dlogits, config.aux_loss_coef);
    optimizer.hyper().learning_rate =
        cosine_learning_rate(o.learning_rate, step, o.warmup_steps, o.steps, o.final_lr_fraction);
    const double grad_norm = optimizer.step();
    window_tokens += N;
    total_tokens += N;
    if (step % o.log_every == 0 || step == o.steps) {
      std::printf("  %6d %10.4f %8.4f %10.4f %12.0f %12s\n", step, loss, aux, grad_norm,
                  window_tokens / seconds_since(window_start), format_bytes(device.peak()).c_str());
      std::fflush(stdout);
      window_start = Clock::now();
      window_tokens = 0;
    }
  }
  const double train_seconds = seconds_since(train_start);

  // Held-out exact-match accuracy with greedy KV-cache generation.
  std::vector<std::vector<int>> prompts;
  std::vector<int64_t> ids;
  for (int i = 0; i < o.eval_prompts; ++i) {
    ids.push_back(ReversalCorpus::kHeldOutBase + i);
    prompts.push_back(corpus.prompt(ids.back()));
  }
  GenerationSettings greedy;
  greedy.max_new_tokens = o.max_digits + 1;
  greedy.eos_token = ReversalCorpus::kEos;
  greedy.temperature = 0.0f;
  greedy.seed = run.seed;
  const auto eval_start = Clock::now();
  const auto samples = generate(model, prompts, ids, greedy);
  const double eval_seconds = seconds_since(eval_start);
  int correct = 0, generated = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    correct += samples[i].tokens == corpus.answer(ids[i]);
    generated += int(samples[i].tokens.size());
  }
  const double accuracy = o.eval_prompts ? double(correct) / o.eval_prompts : 0.0;
  const std::string parameter_path = run.run_dir + "/model.h5";
  save_parameters(parameter_path, config, model.layout(), model.parameters());

  std::printf("#\n# %-34s %16s\n", "summary", "value");
  std::printf("  %-34s %16d\n", "steps", o.steps);
  std::printf("  %-34s %16.4f\n", "final train loss (nats/token)", loss);
  std::printf("  %-34s %16.1f\n", "train time (s)", train_seconds);
  std::printf("  %-34s %16.0f\n", "train throughput (tokens/s)",
              train_seconds > 0 ? total_tokens / train_seconds : 0.0);
  std::printf("  %-34s %16.3f\n", "held-out exact match", accuracy);
  std::printf("  %-34s %16.0f\n", "generation (tokens/s, KV cache)",
              eval_seconds > 0 ? generated / eval_seconds : 0.0);
  std::printf("  %-34s %16s\n", "device memory peak", format_bytes(device.peak()).c_str());
  std::printf("# parameters written to %s\n", parameter_path.c_str());
  if (run.json) {
    std::printf(
        "{\"command\":\"lm\",\"model\":\"%s\",\"steps\":%d,\"final_loss\":%.6f,"
        "\"train_seconds\":%.3f,\"train_tokens_per_s\":%.1f,\"heldout_exact_match\":%.4f,"
        "\"device_peak_bytes\":%zu}\n",
        config.name.c_str(), o.steps, loss, train_seconds,
        train_seconds > 0 ? total_tokens / train_seconds : 0.0, accuracy, device.peak());
  }
  return 0;
}

}  // namespace rlf
