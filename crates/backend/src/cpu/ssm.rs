//! The Mamba2 recurrence one token at a time: the causal depthwise conv and the selective-scan
//! update of one head.
//!
//! States are laid out channel-minor (`[tap, channel]` for the conv, `[state, head_dim]` for the
//! scan) so that every inner loop runs across channels, which vectorise, while each channel's
//! reduction keeps its sequential order. Element-wise multiply then add, no FMA contraction: the
//! AVX-512 build and the portable one give the same bits.

/// One token of a causal depthwise conv over `channels = input.len()` channels: writes
/// `out[c] = bias[c] + Σ_i weight_t[i][c] * past[i][c] + weight_t[k-1][c] * input[c]` (before any
/// activation), then shifts `input` into `past`.
///
/// `past` is `[kernel - 1, channels]`, oldest first; `weight_t` is `[kernel, channels]`.
pub fn conv_step(
    past: &mut [f32],
    weight_t: &[f32],
    bias: Option<&[f32]>,
    input: &[f32],
    out: &mut [f32],
) {
    let channels = input.len();
    assert!(channels > 0 && weight_t.len().is_multiple_of(channels), "conv_step: weight shape");
    let taps = weight_t.len() / channels;
    assert!(taps >= 1 && past.len() == (taps - 1) * channels, "conv_step: state shape");
    assert_eq!(out.len(), channels, "conv_step: output size");
    #[cfg(target_arch = "x86_64")]
    if super::avx512_available() {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { conv_step_avx512(past, weight_t, bias, input, out) };
    }
    conv_step_body(past, weight_t, bias, input, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn conv_step_avx512(
    past: &mut [f32],
    weight_t: &[f32],
    bias: Option<&[f32]>,
    input: &[f32],
    out: &mut [f32],
) {
    conv_step_body(past, weight_t, bias, input, out)
}

#[inline(always)]
fn conv_step_body(
    past: &mut [f32],
    weight_t: &[f32],
    bias: Option<&[f32]>,
    input: &[f32],
    out: &mut [f32],
) {
    let channels = input.len();
    match bias {
        Some(b) => out.copy_from_slice(b),
        None => out.fill(0.0),
    }
    let (taps_w, last_w) = weight_t.split_at(past.len());
    for (w, p) in taps_w.chunks_exact(channels).zip(past.chunks_exact(channels)) {
        for ((o, &w), &p) in out.iter_mut().zip(w).zip(p) {
            *o += w * p;
        }
    }
    for ((o, &w), &x) in out.iter_mut().zip(last_w).zip(input) {
        *o += w * x;
    }
    if !past.is_empty() {
        past.copy_within(channels.., 0);
        let at = past.len() - channels;
        past[at..].copy_from_slice(input);
    }
}

/// One token of the selective scan for one head with `head_dim = x.len()` channels and
/// `state_size = dtb.len()`: for every state index `i` in order,
/// `state[i][p] = state[i][p] * decay + dtb[i] * x[p]`, and
/// `y[p] = Σ_i state[i][p] * c[i] + d * x[p]`, the sum taken in order of `i`.
///
/// `state` is `[state_size, head_dim]`; `dtb` is `dt * B`.
pub fn ssm_step(
    state: &mut [f32],
    x: &[f32],
    dtb: &[f32],
    c: &[f32],
    decay: f32,
    d: f32,
    y: &mut [f32],
) {
    assert_eq!(state.len(), dtb.len() * x.len(), "ssm_step: state shape");
    assert!(c.len() == dtb.len() && y.len() == x.len(), "ssm_step: operand sizes");
    #[cfg(target_arch = "x86_64")]
    if super::avx512_available() {
        // SAFETY: the CPU has AVX-512F.
        return unsafe { ssm_step_avx512(state, x, dtb, c, decay, d, y) };
    }
    ssm_step_body(state, x, dtb, c, decay, d, y)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn ssm_step_avx512(
    state: &mut [f32],
    x: &[f32],
    dtb: &[f32],
    c: &[f32],
    decay: f32,
    d: f32,
    y: &mut [f32],
) {
    ssm_step_body(state, x, dtb, c, decay, d, y)
}

#[inline(always)]
fn ssm_step_body(
    state: &mut [f32],
    x: &[f32],
    dtb: &[f32],
    c: &[f32],
    decay: f32,
    d: f32,
    y: &mut [f32],
) {
    y.fill(0.0);
    for ((s, &b), &c) in state.chunks_exact_mut(x.len()).zip(dtb).zip(c) {
        for ((s, &x), y) in s.iter_mut().zip(x).zip(y.iter_mut()) {
            *s = *s * decay + b * x;
            *y += *s * c;
        }
    }
    for (y, &x) in y.iter_mut().zip(x) {
        *y += d * x;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn conv_step_matches_the_per_channel_definition() {
        let (channels, taps) = (37, 4);
        let weight = seq(taps * channels, 1);
        let bias = seq(channels, 2);
        let mut past = seq((taps - 1) * channels, 3);
        let mut history: Vec<Vec<f32>> = past.chunks(channels).map(<[f32]>::to_vec).collect();
        for step in 0..5 {
            let input = seq(channels, 10 + step);
            let mut out = vec![0.0; channels];
            conv_step(&mut past, &weight, Some(&bias), &input, &mut out);
            for c in 0..channels {
                let mut want = bias[c];
                for (i, h) in history.iter().enumerate() {
                    want += weight[i * channels + c] * h[c];
                }
                want += weight[(taps - 1) * channels + c] * input[c];
                assert_eq!(out[c], want, "step {step} channel {c}");
            }
            history.remove(0);
            history.push(input);
            assert_eq!(past, history.concat());
        }
    }

    #[test]
    fn ssm_step_matches_the_sequential_definition() {
        let (head_dim, state_size) = (19, 8);
        let mut state = seq(state_size * head_dim, 4);
        let mut reference = state.clone();
        for step in 0..4 {
            let (x, dtb, c) =
                (seq(head_dim, 5 + step), seq(state_size, 6 + step), seq(state_size, 7 + step));
            let (decay, d) = (0.9, 0.3);
            let mut y = vec![0.0; head_dim];
            ssm_step(&mut state, &x, &dtb, &c, decay, d, &mut y);
            for p in 0..head_dim {
                let mut acc = 0.0f32;
                for i in 0..state_size {
                    let s = &mut reference[i * head_dim + p];
                    *s = *s * decay + dtb[i] * x[p];
                    acc += *s * c[i];
                }
                assert_eq!(y[p], acc + d * x[p], "step {step} channel {p}");
            }
            assert_eq!(state, reference);
        }
    }
}
