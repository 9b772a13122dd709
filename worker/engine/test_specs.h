// Resolved job specs (every field set) shared by the engine's tests. Tests only.
#ifndef BOULDER_WORKER_ENGINE_TEST_SPECS_H_
#define BOULDER_WORKER_ENGINE_TEST_SPECS_H_

#include <string>

#include "boulder/v1/spec.pb.h"

namespace boulder::engine {

// The arithmetic-sequence task (vocab 96, strides up to 6), one worker, greedy generation of
// 16 tokens after an 8-token prompt; AdamW (0.9, 0.95, 1e-8, no weight decay), clip 1.0.
inline v1::JobSpec ArithmeticTestSpec(const std::string& name, int hidden, int heads, int layers,
                                      int ffn, int context) {
  v1::JobSpec s;
  s.set_name(name);
  v1::ModelSpec* m = s.mutable_model();
  m->set_preset("minigpt");
  m->set_vocab_size(96);
  m->set_hidden(hidden);
  m->set_heads(heads);
  m->set_layers(layers);
  m->set_ffn(ffn);
  m->set_context(context);
  m->set_tie_embeddings(false);
  s.mutable_data()->set_source("arithmetic");
  s.mutable_data()->set_max_stride(6);
  v1::TrainingSpec* t = s.mutable_training();
  t->set_beta1(0.9);
  t->set_beta2(0.95);
  t->set_eps(1e-8);
  t->set_weight_decay(0.0);
  t->set_grad_accum_steps(1);
  t->set_grad_clip(1.0);
  s.mutable_resources()->set_workers(1);
  s.mutable_generation()->set_prompt_len(8);
  s.mutable_generation()->set_tokens(16);
  return s;
}

// A small model (64 hidden, 4 heads, 2 layers) that learns the task in seconds on the CPU:
// batch 16 x 32, lr 5e-3 with 20 warm-up steps and cosine decay to 0.1, deterministic, a
// report every 10 steps.
inline v1::JobSpec SmallTestSpec(int steps, const std::string& precision,
                                 const std::string& backend) {
  v1::JobSpec s = ArithmeticTestSpec("small", 64, 4, 2, 256, 32);
  v1::TrainingSpec* t = s.mutable_training();
  t->set_steps(steps);
  t->set_batch_size(16);
  t->set_seq_len(32);
  t->set_lr(5e-3);
  t->set_warmup_steps(20);
  t->set_schedule("cosine");
  t->set_min_lr_ratio(0.1);
  t->set_seed(1);
  t->set_deterministic(true);
  t->set_log_every_steps(10);
  s.set_precision(precision);
  s.mutable_resources()->set_backend(backend);
  return s;
}

// The seed mini-GPT (768 hidden, 12 heads, 4 layers, FFN 3072, context 256) at batch 8 x 64,
// constant lr 3e-4, not deterministic, a report every step: the GPU tests' seed job.
inline v1::JobSpec SeedTestSpec(int steps, const std::string& precision,
                                const std::string& backend) {
  v1::JobSpec s = ArithmeticTestSpec("seed", 768, 12, 4, 3072, 256);
  v1::TrainingSpec* t = s.mutable_training();
  t->set_steps(steps);
  t->set_batch_size(8);
  t->set_seq_len(64);
  t->set_lr(3e-4);
  t->set_warmup_steps(0);
  t->set_schedule("constant");
  t->set_min_lr_ratio(0.0);
  t->set_seed(1337);
  t->set_deterministic(false);
  t->set_log_every_steps(1);
  s.set_precision(precision);
  s.mutable_resources()->set_backend(backend);
  return s;
}

// The seed job itself: examples/minigpt.yaml (batch 32 x 256, 200 steps at a constant 3e-4,
// seed 1337), not deterministic, a report every 10 steps. GPU-sized: about a second of
// training on an H200, far too slow for the CPU tests.
inline v1::JobSpec SeedJobSpec(const std::string& precision, const std::string& backend) {
  v1::JobSpec s = SeedTestSpec(200, precision, backend);
  v1::TrainingSpec* t = s.mutable_training();
  t->set_batch_size(32);
  t->set_seq_len(256);
  t->set_log_every_steps(10);
  return s;
}

// The FP8 section at its defaults (hybrid, history 16, max, margin 0, 10 skips).
inline void SetTestFp8(v1::JobSpec* s, bool emulate) {
  v1::Fp8Spec* f = s->mutable_fp8();
  f->set_format("hybrid");
  f->set_amax_history_len(16);
  f->set_amax_compute_algo("max");
  f->set_margin(0);
  f->set_emulate(emulate);
  f->set_max_consecutive_skips(10);
}

}  // namespace boulder::engine

#endif  // BOULDER_WORKER_ENGINE_TEST_SPECS_H_
