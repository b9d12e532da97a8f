//! Exact sums of token probabilities.
//!
//! The seeded draw compares cumulative probability masses with its targets. Summed in floating
//! point, a mass would depend on the order of the additions, so every way of finding the token
//! (sorting the candidates, or grouping them in buckets first) would need the same order to give
//! the same token. Summed exactly, it does not: [`Mass`] holds a sum of `f32` values in `[0, 1]`
//! as a fixed-point integer whose unit is the smallest `f32` (2^-149), and only the comparison
//! rounds (to `f64`, monotonically: a larger mass never rounds lower).

/// The unit of [`Mass`]: 2^-149, the smallest positive `f32`.
const UNIT_EXP: i32 = -149;

/// An exact sum of `f32` values in `[0, 1]`: a 256-bit fixed-point integer (little-endian
/// limbs) counting units of 2^-149. A value in `[0, 1]` is below 2^149 units, so 2^100 of them
/// fit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Mass([u64; 4]);

impl Mass {
    /// Adds `p`, which must lie in `[0, 1]` (anything else adds nothing).
    #[inline]
    pub(super) fn add(&mut self, p: f32) {
        if !(0.0..=1.0).contains(&p) {
            return;
        }
        let (m, shift) = split(p);
        self.add_scaled(u64::from(m), shift);
    }

    /// Adds `m * 2^shift` units, for `shift` below 192.
    #[inline]
    fn add_scaled(&mut self, m: u64, shift: u32) {
        let v = u128::from(m) << (shift % 64);
        let limb = (shift / 64) as usize;
        let (lo, carry) = self.0[limb].overflowing_add(v as u64);
        self.0[limb] = lo;
        let (hi, c1) = self.0[limb + 1].overflowing_add((v >> 64) as u64);
        let (hi, c2) = hi.overflowing_add(u64::from(carry));
        self.0[limb + 1] = hi;
        let mut carry = c1 || c2;
        for l in &mut self.0[limb + 2..] {
            if !carry {
                break;
            }
            (*l, carry) = l.overflowing_add(1);
        }
    }

    /// The exact sum that [`ExponentSums`] counts.
    pub(super) fn from_exponent_sums(sums: &ExponentSums) -> Self {
        let mut mass = Mass::default();
        for (exp, &m) in sums.0.iter().enumerate() {
            // A normal value's exponent less one, as `split` shifts it; subnormals by 0.
            let shift = (exp as u32).saturating_sub(1);
            // `m` sums up to 2^40 mantissas of 24 bits: its two halves shift apart.
            mass.add_scaled(m & 0xffff_ffff, shift);
            mass.add_scaled(m >> 32, shift + 32);
        }
        mass
    }

    /// Adds another mass.
    pub(super) fn add_mass(&mut self, other: &Mass) {
        let mut carry = false;
        for (a, &b) in self.0.iter_mut().zip(&other.0) {
            let (s, c1) = a.overflowing_add(b);
            let (s, c2) = s.overflowing_add(u64::from(carry));
            *a = s;
            carry = c1 || c2;
        }
    }

    /// The sum as an `f64`: its top 64 significant bits, rounded to the nearest `f64`. Monotone:
    /// `a <= b` gives `a.to_f64() <= b.to_f64()`.
    pub(super) fn to_f64(self) -> f64 {
        let Some(top) = self.0.iter().rposition(|&l| l != 0) else { return 0.0 };
        let lead = self.0[top].leading_zeros();
        // The 64 bits below the leading one (inclusive), and the power of two of their last.
        let below = if top > 0 { u128::from(self.0[top - 1]) } else { 0 };
        let high = u128::from(self.0[top]) << 64 | below;
        let bits = (high << lead >> 64) as u64;
        let low_exp = 64 * top as i32 - lead as i32 + UNIT_EXP;
        // An exact power of two: low_exp lies within -213 ..= 43, far inside f64's normal range.
        bits as f64 * f64::from_bits(((1023 + low_exp) as u64) << 52)
    }
}

/// `p`'s mantissa (with the implicit bit) and its shift in units of 2^-149.
#[inline]
fn split(p: f32) -> (u32, u32) {
    let bits = p.to_bits();
    let (exp, frac) = (bits >> 23, bits & 0x7f_ffff);
    // p = m * 2^(shift - 149): a subnormal is its fraction in units; a normal value has the
    // implicit bit and is shifted by its biased exponent less one (at most 126 for p <= 1).
    if exp == 0 { (frac, 0) } else { (frac | 1 << 23, exp - 1) }
}

/// A cheaper way to sum many values in `[0, 1]` exactly: the mantissas of the values of each
/// exponent added as integers (up to 2^40 values), turned into a [`Mass`] once at the end.
pub(super) struct ExponentSums([u64; 128]);

impl Default for ExponentSums {
    fn default() -> Self {
        Self([0; 128])
    }
}

impl ExponentSums {
    /// Adds `p`, which must lie in `[0, 1]` (anything else adds nothing).
    #[inline]
    pub(super) fn add(&mut self, p: f32) {
        if !(0.0..=1.0).contains(&p) {
            return;
        }
        let bits = p.to_bits();
        let m = (bits & 0x7f_ffff) | if bits >> 23 == 0 { 0 } else { 1 << 23 };
        self.0[(bits >> 23) as usize] += u64::from(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(values: &[f32]) -> Mass {
        let mut m = Mass::default();
        values.iter().for_each(|&v| m.add(v));
        m
    }

    #[test]
    fn small_sums_are_the_floating_point_sums() {
        let values = [0.5f32, 0.25, 1.0, 0.125, 3.0e-5, 0.0];
        assert_eq!(sum(&values).to_f64(), values.iter().map(|&v| v as f64).sum::<f64>());
        assert_eq!(sum(&[f32::from_bits(1)]).to_f64(), 2f64.powi(-149), "the smallest subnormal");
        assert_eq!(sum(&[1.0; 1000]).to_f64(), 1000.0);
        assert_eq!(Mass::default().to_f64(), 0.0);
    }

    #[test]
    fn the_sum_does_not_depend_on_the_order() {
        // Values spanning 2^-120 .. 1: a floating-point sum loses the small ones, differently in
        // each order; the exact one keeps them all.
        let mut values: Vec<f32> = (0..4000).map(|i| (-(i as f32) * 0.021).exp2()).collect();
        values.extend([1.0, 0.75, f32::MIN_POSITIVE, 1e-40]);
        let forward = sum(&values);
        values.reverse();
        assert_eq!(sum(&values), forward);
        let mut halves = sum(&values[..2001]);
        halves.add_mass(&sum(&values[2001..]));
        assert_eq!(halves, forward);
        let f32_forward: f32 = values.iter().sum();
        let f32_backward: f32 = values.iter().rev().sum();
        assert_ne!(f32_forward, f32_backward, "the test's values do round differently");
    }

    #[test]
    fn carries_cross_limbs() {
        // 2^64 units is 2^-85: adding enough values just below a limb boundary carries.
        let just_below = f32::from_bits(((127 - 85 - 1) << 23) | 0x7f_ffff);
        let m = sum(&vec![just_below; 1 << 12]);
        let want = (1u64 << 12) as f64 * just_below as f64;
        assert_eq!(m.to_f64(), want);
        assert_eq!(sum(&[1.0; 3]).to_f64(), 3.0);
    }

    #[test]
    fn rounding_to_f64_is_monotone() {
        let mut m = Mass::default();
        let mut last = 0.0;
        for i in 0..5000 {
            m.add(((i * 7919) % 1000) as f32 * 1e-3 + 1e-30);
            let now = m.to_f64();
            assert!(now >= last, "step {i}: {now} < {last}");
            last = now;
        }
    }

    #[test]
    fn exponent_sums_are_the_exact_sum() {
        let mut values: Vec<f32> = (0..20_000).map(|i| (-(i as f32) * 0.007).exp2()).collect();
        values.extend([1.0, 1.0, f32::from_bits(3), 0.0]);
        let mut sums = ExponentSums::default();
        values.iter().for_each(|&v| sums.add(v));
        assert_eq!(Mass::from_exponent_sums(&sums), sum(&values));
        let mut many = ExponentSums::default();
        (0..1 << 20).for_each(|_| many.add(1.0 - f32::EPSILON / 2.0));
        assert_eq!(Mass::from_exponent_sums(&many), sum(&vec![1.0 - f32::EPSILON / 2.0; 1 << 20]));
    }

    #[test]
    fn values_outside_zero_to_one_add_nothing() {
        assert_eq!(sum(&[f32::NAN, -1.0, 2.0, f32::INFINITY]), Mass::default());
    }
}
