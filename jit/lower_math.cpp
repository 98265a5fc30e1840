// lower_math.cpp -- float32 transcendental functions emitted inline as straight-line vector
// code (no calls), for the ops whose cost bounds fused kernels: exp (softmax, sigmoid, silu),
// erf (GELU) and tanh (GELU-tanh). Each is a few FMA polynomials and a select between a small-
// argument and a large-argument form, both computed (no data-dependent branches). Rules that
// the error bounds rely on: every fma stays a real llvm.fma, no fast-math flags anywhere, and
// clamps are compare+select in the operand order that maps to one x86 min/max and keeps NaN.
// float64 and the rarer functions go to the target's library (KernelEmitter::math: SLEEF on
// the CPU, libdevice on NVIDIA GPUs).
//
// Accuracy is checked against double-precision libm over every float32 input by
// perf/math_accuracy.cpp (`make check-math`), and over a sample in tests/c/test_pointwise.cpp.
#include "kernel.h"

namespace dynamo::jit::detail {

Value *KernelEmitter::f32c(double x) { return splat(ConstantFP::get(B.getFloatTy(), x)); }
Value *KernelEmitter::i32c(int32_t x) { return splat(B.getInt32(x)); }

Value *KernelEmitter::fma32(Value *a, Value *b, Value *c) {
  return B.CreateIntrinsic(Intrinsic::fma, {a->getType()}, {a, b, c});
}

// p * 2^n for integer-valued float n in [-150, 129], p in [0.5, 2) (or NaN). The target's one
// instruction where it has one (AVX-512's vscalefps); elsewhere two factors, each a normal
// float built from exponent bits, so that denormal results and 2^128 * p come out right.
Value *KernelEmitter::scale_pow2(Value *p, Value *n) {
  if (Value *r = native_scale_pow2(p, n)) return r;
  llvm::Type *it = L == 1 ? (llvm::Type *)B.getInt32Ty() : FixedVectorType::get(B.getInt32Ty(), L);
  Value *ni = B.CreateFPToSI(n, it);
  Value *n1 = B.CreateAShr(ni, i32c(1));
  Value *n2 = B.CreateSub(ni, n1);
  auto pow2 = [&](Value *k) { return B.CreateBitCast(B.CreateShl(B.CreateAdd(k, i32c(127)), i32c(23)), p->getType()); };
  return B.CreateFMul(B.CreateFMul(p, pow2(n1)), pow2(n2));
}

// Clamps that let NaN through in one x86 min/max: `c < x ? c : x` is minps(c, x), which
// returns its second operand when either is NaN.
Value *KernelEmitter::min_c(Value *x, double c) {
  Value *k = f32c(c);
  return B.CreateSelect(B.CreateFCmpOLT(k, x), k, x);
}

Value *KernelEmitter::max_c(Value *x, double c) {
  Value *k = f32c(c);
  return B.CreateSelect(B.CreateFCmpOGT(k, x), k, x);
}

Value *KernelEmitter::horner(Value *x, const float *c, int n) {
  Value *p = f32c(c[n - 1]);
  for (int k = n - 2; k >= 0; --k) p = fma32(p, x, f32c(c[k]));
  return p;
}

// exp(x): n = round(x / ln 2), r = x - n ln 2 (two-part ln 2 with FMA, |r| <= 0.35), e^r by
// its degree-7 Taylor polynomial (truncation < 6e-9 relative), times 2^n. NaN passes through
// every step; x > 88.8 gives inf through the clamp. x < -104 (e^x below half the least
// denormal: 0) is selected as 0 and computed as e^0: scaling into the underflow costs an x86
// microcode assist per element, 4x a masked softmax's time when half its scores are -inf or
// finfo.min (causal masks). Results between -104 and -87.3 are denormals, kept as eager keeps them;
// exp_flush makes them 0 too (x < ln FLT_MIN = -87.3365: every result it gives is normal or 0).
Value *KernelEmitter::exp_f32(Value *x, bool flush_subnormal) {
  Value *zero = B.CreateFCmpOLT(x, f32c(flush_subnormal ? -87.33654475 : -104.0));
  Value *xc = B.CreateSelect(zero, f32c(0.0), min_c(x, 88.8));
  Value *n = B.CreateUnaryIntrinsic(Intrinsic::roundeven, B.CreateFMul(xc, f32c(1.44269504088896341)));
  Value *r = fma32(n, f32c(-0.693145751953125), xc);  // ln 2 high part (exact in 16 bits)
  r = fma32(n, f32c(-1.428606765330187e-06), r);      // ln 2 low part
  static const double kInvFact[] = {1.0 / 5040, 1.0 / 720, 1.0 / 120, 1.0 / 24, 1.0 / 6, 0.5, 1.0, 1.0};
  Value *p = f32c(kInvFact[0]);
  for (int k = 1; k < 8; ++k) p = fma32(p, r, f32c(kInvFact[k]));
  return B.CreateSelect(zero, f32c(0.0), scale_pow2(p, n));
}

// erf(x) on t = |x|, then copysign (odd by construction; -0 and NaN pass through):
//   t <= 0.875: t + t * P(t^2), P of degree 5 (minimax for erf(t)/t - 1);
//   t >  0.875: 1 - 2^Q(tc), tc = min(t, 4), Q = tc * R(tc) ~ log2(erfc(tc)) with R of degree 5;
//               n = rint(Q), f = fma(R, tc, -n) in one rounding (Q has no constant term, which
//               is what keeps every result within 1 ulp), 2^f by a degree-5 polynomial, times 2^n
//               (n in [-28, 0]). erfc(4) < 2^-25, so t >= 4 gives 1.
// Every float32 input is within 1 ulp of the correctly rounded result (max 1.30 ulp of the
// exact value; `make check-math`); about 7x cheaper than SLEEF's erf u10 here.
Value *KernelEmitter::erf_f32(Value *x) {
  static const float kP[] = {0x1.06eba6p-3f, -0x1.8126eep-2f, 0x1.ce1beep-4f,
                             -0x1.b6a216p-6f, 0x1.47c52ap-8f, -0x1.3c5668p-11f};
  static const float kR[] = {-0x1.a0cc5ap+0f, -0x1.d58d32p-1f, -0x1.3728e2p-3f,
                             0x1.0ee928p-5f, -0x1.30ef2p-8f, 0x1.45985ep-12f};
  static const float kE[] = {1.0f, 0x1.62e42ap-1f, 0x1.ebf9c2p-3f, 0x1.c6b6dap-5f, 0x1.3ce8b4p-7f, 0x1.5bd9a8p-10f};
  Value *t = B.CreateUnaryIntrinsic(Intrinsic::fabs, x);
  Value *small = fma32(t, horner(B.CreateFMul(t, t), kP, 6), t);
  Value *tc = min_c(t, 4.0);
  Value *r = horner(tc, kR, 6);
  Value *n = B.CreateUnaryIntrinsic(Intrinsic::rint, B.CreateFMul(r, tc));
  Value *f = fma32(r, tc, B.CreateFNeg(n));
  Value *large = B.CreateFSub(f32c(1.0), scale_pow2(horner(f, kE, 6), n));
  Value *res = B.CreateSelect(B.CreateFCmpOGT(t, f32c(0.875)), large, small);
  return B.CreateBinaryIntrinsic(Intrinsic::copysign, res, x);
}

// tanh(x) on t = |x|, then copysign:
//   t <= 0.625: t + t * (s * P(s)), s = t^2, P of degree 4 (tiny inputs return x exactly);
//   t >  0.625: 1 - 2 / (e^(2 tc) + 1), tc = min(t, 9.5); e^(2 tc) = 2^(tc * 2/ln 2) with the
//               2/ln 2 constant in two parts, a degree-6 polynomial for 2^f, times 2^n
//               (n in [0, 28]). 1 - tanh(9.5) < 2^-25, so t >= 9.5 gives 1.
// Every float32 input is within 1 ulp of the correctly rounded result (max 1.41 ulp of the
// exact value); about 5x cheaper than SLEEF's tanh u10 here.
Value *KernelEmitter::tanh_f32(Value *x) {
  static const float kT[] = {-0x1.555532p-2f, 0x1.1106f6p-3f, -0x1.b835a4p-5f, 0x1.51f8cep-6f, -0x1.750ce2p-8f};
  static const float kF[] = {1.0f, 0x1.62e43p-1f, 0x1.ebfbdcp-3f, 0x1.c6af7cp-5f,
                             0x1.3b2dep-7f, 0x1.5f083p-10f, 0x1.416b46p-13f};
  Value *t = B.CreateUnaryIntrinsic(Intrinsic::fabs, x);
  Value *s = B.CreateFMul(t, t);
  Value *small = fma32(t, B.CreateFMul(horner(s, kT, 5), s), t);
  Value *tc = min_c(t, 9.5);
  Value *khi = f32c(0x1.715476p+1f), *klo = f32c(0x1.4ae0cp-25f);  // 2/ln 2 = khi + klo
  Value *n = B.CreateUnaryIntrinsic(Intrinsic::rint, B.CreateFMul(tc, khi));
  Value *f = fma32(tc, khi, B.CreateFNeg(n));
  f = fma32(tc, klo, f);
  Value *e = scale_pow2(horner(f, kF, 7), n);
  Value *large = B.CreateFSub(f32c(1.0), B.CreateFDiv(f32c(2.0), B.CreateFAdd(e, f32c(1.0))));
  Value *res = B.CreateSelect(B.CreateFCmpOGT(t, f32c(0.625)), large, small);
  return B.CreateBinaryIntrinsic(Intrinsic::copysign, res, x);
}

// sigmoid(x) = 1 / (1 + e) for x >= 0 and e / (1 + e) for x < 0, with e = exp(-|x|) <= 1: no
// overflow, and results in the denormal range keep their digits (1 / (1 + exp(-x)) does not).
Value *KernelEmitter::sigmoid_f32(Value *x) {
  Value *e = exp_f32(B.CreateFNeg(B.CreateUnaryIntrinsic(Intrinsic::fabs, x)));
  Value *num = B.CreateSelect(B.CreateFCmpOLT(x, f32c(0.0)), e, f32c(1.0));
  return B.CreateFDiv(num, B.CreateFAdd(f32c(1.0), e));
}

}  // namespace dynamo::jit::detail
