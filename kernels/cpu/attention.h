// Causal multi-head self-attention over qkv[B,T,3C] (q, k, v each [B,T,NH,HS], HS = C/NH),
// scale 1/sqrt(HS).
//
// Forward, per (b, h) pair and query row t: scores s_j = scale q_t·k_j for j <= t, their max
// m, p_j = exp(s_j - m), out_t = Σ p_j v_j / Σ p_j, and stats = m + log Σ p_j (the
// log-sum-exp of the scaled scores). Two passes over a per-thread scratch row of T scores;
// nothing of size T×T is kept.
//
// Backward (flash-attention style), per (b, h) and query row t: recompute
// p_j = exp(s_j - stats_t), then with D_t = dout_t·out_t and ds_j = p_j (dout_t·v_j - D_t):
//   dq_t = scale Σ_j ds_j k_j,  dk_j += scale ds_j q_t,  dv_j += p_j dout_t.
// The FP64 instantiation recomputes the log-sum-exp from the scores in FP64 instead of
// reading stats (FP32 would limit its gradients to ~1e-7 relative accuracy, and it exists
// for finite differences).
// dqkv is written (=, not +=): each (b, h) pair clears and then owns its head's slice of dq,
// dk and dv, so pairs run in parallel with no shared writes and a fixed summation order.
#ifndef BOULDER_KERNELS_CPU_ATTENTION_H_
#define BOULDER_KERNELS_CPU_ATTENTION_H_

namespace boulder::kernels::cpu {

// REQUIRES: NH divides C. stats: FP32 [B,NH,T].
template <typename S>
void AttentionForward(int threads, S* out, float* stats, const S* qkv, int B, int T, int C, int NH);

template <typename S>
void AttentionBackward(int threads, S* dqkv, const S* dout, const S* qkv, const S* out,
                       const float* stats, int B, int T, int C, int NH);

}  // namespace boulder::kernels::cpu

#endif  // BOULDER_KERNELS_CPU_ATTENTION_H_
