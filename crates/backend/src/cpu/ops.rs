//! Element-wise and row-wise kernels.

/// RMSNorm of each `weight.len()`-wide row of `x` into `out`: `x / sqrt(mean(x²) + eps) * weight`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let h = weight.len();
    for (xr, or) in x.chunks_exact(h).zip(out.chunks_exact_mut(h)) {
        let inv = inv_rms(xr, eps);
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = w * (v * inv);
        }
    }
}

/// In-place [`rms_norm`], for per-head norms.
pub fn rms_norm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let h = weight.len();
    for xr in x.chunks_exact_mut(h) {
        let inv = inv_rms(xr, eps);
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v = w * (*v * inv);
        }
    }
}

fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let sum_sq = super::dot(x, x);
    1.0 / (sum_sq / x.len() as f32 + eps).sqrt()
}

/// `x * sigmoid(x)`, with the polynomial `exp` of `exp_nonpositive` at `-|x|` (so it never
/// overflows): `x / (1 + e)` for `x >= 0`, `x * e / (1 + e)` below. Branch-free, so the slice
/// versions vectorise; every version gives the same bits.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    let e = exp_nonpositive(-x.abs());
    let numerator = if x >= 0.0 { x } else { x * e };
    numerator / (1.0 + e)
}

/// In-place SiLU.
pub fn silu_inplace(x: &mut [f32]) {
    with_avx512!(silu_inplace_body(x: &mut [f32]))
}

#[inline(always)]
fn silu_inplace_body(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = silu(*v));
}

/// `a[i] *= silu(g[i])`: the gate of SwiGLU blocks and of Mamba2's gated norm.
pub fn mul_silu_inplace(a: &mut [f32], g: &[f32]) {
    assert_eq!(a.len(), g.len(), "mul_silu_inplace: length mismatch");
    with_avx512!(mul_silu_inplace_body(a: &mut [f32], g: &[f32]))
}

#[inline(always)]
fn mul_silu_inplace_body(a: &mut [f32], g: &[f32]) {
    a.iter_mut().zip(g).for_each(|(v, &g)| *v *= silu(g));
}

/// In-place squared ReLU: `max(x, 0)²`.
pub fn relu2_inplace(x: &mut [f32]) {
    x.iter_mut().for_each(|v| {
        let r = v.max(0.0);
        *v = r * r;
    });
}

/// `log(1 + exp(x))`, linear above 20 as torch does.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// `softmax(scale * x)` in place (attention probabilities): the exponentials by the polynomial
/// `exp`, summed in 16 lanes (element `i` in lane `i % 16`) folded by a fixed tree, so a row's
/// result depends only on the row, never on the instruction set.
pub fn softmax_scaled_inplace(x: &mut [f32], scale: f32) {
    with_avx512!(softmax_scaled_body(x: &mut [f32], scale: f32))
}

#[inline(always)]
fn softmax_scaled_body(x: &mut [f32], scale: f32) {
    let mut max = [f32::NEG_INFINITY; 16];
    let mut chunks = x.chunks_exact_mut(16);
    for chunk in &mut chunks {
        for (m, v) in max.iter_mut().zip(chunk) {
            *v *= scale;
            *m = m.max(*v);
        }
    }
    for (m, v) in max.iter_mut().zip(chunks.into_remainder()) {
        *v *= scale;
        *m = m.max(*v);
    }
    // The maximum is exact whatever the order.
    let max = max.into_iter().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = [0.0f32; 16];
    let mut chunks = x.chunks_exact_mut(16);
    for chunk in &mut chunks {
        for (s, v) in sum.iter_mut().zip(chunk) {
            *v = exp_nonpositive(*v - max);
            *s += *v;
        }
    }
    for (s, v) in sum.iter_mut().zip(chunks.into_remainder()) {
        *v = exp_nonpositive(*v - max);
        *s += *v;
    }
    let sum = fold16(sum);
    x.iter_mut().for_each(|v| *v /= sum);
}

/// The 16 lane sums folded pairwise (lane `i` plus lane `i + width`, halving the width).
#[inline(always)]
fn fold16(mut acc: [f32; 16]) -> f32 {
    let mut width = 8;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0]
}

/// In-place softmax of one row.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Log-softmax of one row into `out`.
pub fn log_softmax(x: &[f32], out: &mut [f32]) {
    let log_z = log_sum_exp(x);
    for (o, v) in out.iter_mut().zip(x) {
        *o = v - log_z;
    }
}

/// `log(Σ exp(x))`, shifted by the maximum: the normaliser of [`log_softmax`], whose entry `i`
/// is `x[i] - log_sum_exp(x)`.
pub fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    max + sum_exp_below(x, max).ln()
}

/// `Σ exp(x[i] - max)` for `max >= x[i]` (a whole vocabulary row), with a polynomial `exp` that
/// vectorises: 16 lane sums in order, folded by a fixed tree, so a row's result does not depend on
/// the instruction set. Each term is within 2 ulp of the correctly rounded `exp`.
pub fn sum_exp_below(x: &[f32], max: f32) -> f32 {
    with_avx512!(sum_exp_below_body(x: &[f32], max: f32) -> f32)
}

#[inline(always)]
fn sum_exp_below_body(x: &[f32], max: f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let mut chunks = x.chunks_exact(16);
    for chunk in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(chunk) {
            *a += exp_nonpositive(v - max);
        }
    }
    for (a, &v) in acc.iter_mut().zip(chunks.remainder()) {
        *a += exp_nonpositive(v - max);
    }
    fold16(acc)
}

/// `out[i] = exp((x[i] - max) * scale)` for `x[i] <= max` and `scale > 0` (a row's sampling
/// weights at temperature `1 / scale`), by [`exp_nonpositive`]: the same bits as calling it per
/// element, many at a time. Returns their sum in [`sum_exp_below`]'s order, so that at `scale`
/// 1 it is `sum_exp_below(x, max)` bit for bit (`(v - max) * 1` is `v - max`).
pub fn exp_below(x: &[f32], max: f32, scale: f32, out: &mut [f32]) -> f32 {
    with_avx512!(exp_below_body(x: &[f32], max: f32, scale: f32, out: &mut [f32]) -> f32)
}

#[inline(always)]
fn exp_below_body(x: &[f32], max: f32, scale: f32, out: &mut [f32]) -> f32 {
    let n = x.len().min(out.len());
    let (x, out) = (&x[..n], &mut out[..n]);
    let mut acc = [0.0f32; 16];
    let mut outs = out.chunks_exact_mut(16);
    let mut chunks = x.chunks_exact(16);
    for (o, chunk) in (&mut outs).zip(&mut chunks) {
        for ((a, o), &v) in acc.iter_mut().zip(o).zip(chunk) {
            *o = exp_nonpositive((v - max) * scale);
            *a += *o;
        }
    }
    for ((a, o), &v) in acc.iter_mut().zip(outs.into_remainder()).zip(chunks.remainder()) {
        *o = exp_nonpositive((v - max) * scale);
        *a += *o;
    }
    fold16(acc)
}

/// `exp(x)` for `x <= 0` (NaN-free input; NaN gives `exp(-87)`): `2^n · e^r` with
/// `x = n ln 2 + r`, `|r| <= ln 2 / 2`, `ln 2` split in two so `r` is nearly exact, and Cephes'
/// degree-5 minimax polynomial for `(e^r - 1 - r) / r²`. Plain multiply and add throughout
/// (branch-free, so it vectorises).
#[inline(always)]
pub fn exp_nonpositive(x: f32) -> f32 {
    // Below this, e^x is under the smallest normal float: flush to zero (at the end, so the
    // arithmetic runs on a value whose scale is representable).
    let flush = x < -87.0;
    let x = x.max(-87.0);
    // Round to nearest by the 1.5 * 2^23 trick: exact for |x * log2(e)| < 2^22.
    const SHIFTER: f32 = 12_582_912.0;
    let n = (x * std::f32::consts::LOG2_E + SHIFTER) - SHIFTER;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e_r = p * (r * r) + r + 1.0;
    let scale = f32::from_bits((((n as i32) + 127) << 23) as u32);
    if flush { 0.0 } else { e_r * scale }
}

/// Index of the first maximum (as `argmax` in torch).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

/// `a += b`.
pub fn add_assign(a: &mut [f32], b: &[f32]) {
    with_avx512!(add_assign_body(a: &mut [f32], b: &[f32]))
}

#[inline(always)]
fn add_assign_body(a: &mut [f32], b: &[f32]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
}

/// `a *= s`.
pub fn scale_inplace(a: &mut [f32], s: f32) {
    a.iter_mut().for_each(|x| *x *= s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softmax_sums_to_one_and_log_softmax_agrees() {
        let mut x = vec![1.0, 2.0, -3.0, 0.5];
        let mut lp = vec![0.0; 4];
        log_softmax(&x, &mut lp);
        softmax_inplace(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        for (p, l) in x.iter().zip(&lp) {
            assert!((p.ln() - l).abs() < 1e-5);
        }
    }

    #[test]
    fn row_weights_are_the_polynomial_and_sum_as_sum_exp_below() {
        for n in [0, 1, 15, 16, 17, 1000, 4099] {
            let mut x: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1013) as f32 * -0.013).collect();
            if n > 3 {
                x[3] = f32::NEG_INFINITY;
            }
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut out = vec![f32::NAN; n];
            let sum = exp_below(&x, max, 1.0, &mut out);
            assert_eq!(sum.to_bits(), sum_exp_below(&x, max).to_bits(), "{n} elements");
            for (o, &v) in out.iter().zip(&x) {
                assert_eq!(o.to_bits(), exp_nonpositive(v - max).to_bits());
            }
            exp_below(&x, max, 2.5, &mut out);
            for (o, &v) in out.iter().zip(&x) {
                assert_eq!(o.to_bits(), exp_nonpositive((v - max) * 2.5).to_bits());
            }
        }
    }

    #[test]
    fn polynomial_exp_is_within_two_ulp_and_sums_match() {
        let xs: Vec<f32> = (0..20_000).map(|i| -(i as f32) * 0.0043).collect();
        for &x in &xs {
            let (got, want) = (exp_nonpositive(x), (x as f64).exp() as f32);
            let ulp = (want.to_bits() as i64 - got.to_bits() as i64).abs();
            assert!(ulp <= 2 || want < f32::MIN_POSITIVE, "exp({x}): {got} vs {want}");
        }
        let row: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 * 0.07 - 3.0).collect();
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: f64 = row.iter().map(|&v| ((v - max) as f64).exp()).sum();
        assert!((sum_exp_below(&row, max) as f64 / want - 1.0).abs() < 1e-6);
        assert_eq!(sum_exp_below(&row, max), sum_exp_below_body(&row, max));
    }

    /// Inputs across the range activations take, both signs, ties and a ragged tail.
    fn activations() -> Vec<f32> {
        (0..4099).map(|i| ((i * 7919) % 2003) as f32 * 0.013 - 13.0).collect()
    }

    #[test]
    fn silu_is_close_to_exact_and_every_build_agrees() {
        let xs = activations();
        for &x in xs.iter().chain(&[0.0, -0.0, 1e-30, -1e-30, 90.0, -90.0, 1e6, -1e6]) {
            let want = x as f64 / (1.0 + (-x as f64).exp());
            let got = silu(x) as f64;
            // Far below zero the result is under 1e-35 (torch: -0.0): flushed, not exact.
            assert!((got - want).abs() <= 4.0 * f32::EPSILON as f64 * want.abs() + 1e-35, "{x}");
        }
        let mut a = xs.clone();
        silu_inplace(&mut a);
        let mut b = xs.clone();
        silu_inplace_body(&mut b);
        assert!(a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(a.iter().zip(&xs).all(|(a, &x)| a.to_bits() == silu(x).to_bits()));
        let (mut m, mut n) = (vec![1.5f32; xs.len()], vec![1.5f32; xs.len()]);
        mul_silu_inplace(&mut m, &xs);
        mul_silu_inplace_body(&mut n, &xs);
        assert!(m.iter().zip(&n).all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(m.iter().zip(&xs).all(|(m, &x)| m.to_bits() == (1.5 * silu(x)).to_bits()));
    }

    #[test]
    fn scaled_softmax_is_close_to_exact_and_every_build_agrees() {
        for len in [1, 7, 16, 33, 512, 4099] {
            let x: Vec<f32> = activations()[..len].to_vec();
            let mut got = x.clone();
            softmax_scaled_inplace(&mut got, 0.125);
            let max = x.iter().map(|&v| v as f64 * 0.125).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = x.iter().map(|&v| (v as f64 * 0.125 - max).exp()).sum();
            for (&g, &v) in got.iter().zip(&x) {
                let want = (v as f64 * 0.125 - max).exp() / z;
                assert!((g as f64 - want).abs() <= 1e-6 * want + 1e-12, "{len}: {g} vs {want}");
            }
            let mut portable = x.clone();
            softmax_scaled_body(&mut portable, 0.125);
            assert!(got.iter().zip(&portable).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }

    #[test]
    fn argmax_takes_the_first_maximum() {
        assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), 1);
    }

    #[test]
    fn rms_norm_scales_by_weight() {
        let x = [3.0, 4.0];
        let mut out = [0.0; 2];
        rms_norm(&x, &[1.0, 2.0], 0.0, &mut out);
        let rms = (12.5f32).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 8.0 / rms).abs() < 1e-6);
    }
}
