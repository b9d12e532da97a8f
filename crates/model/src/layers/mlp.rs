//! A dense feed-forward block: SwiGLU (`down(silu(gate x) * up x)`) or squared ReLU
//! (`down(relu(up x)²)`). MoE experts are blocks of this kind.

use crate::{
    config::FfnActivation,
    workspace::{MlpWork, zeroed},
};
use routed_backend::cpu::{self, Matrix};

pub(crate) struct Mlp {
    pub activation: FfnActivation,
    /// `[inter, hidden]`; absent for squared ReLU.
    pub gate: Option<Matrix>,
    /// `[inter, hidden]`.
    pub up: Matrix,
    /// `[hidden, inter]`.
    pub down: Matrix,
    pub hidden: usize,
    pub inter: usize,
}

impl Mlp {
    /// Applies the block to every row of `x` (`[n, hidden]`) into `out`.
    pub fn forward(&self, x: &[f32], out: &mut [f32], work: &mut MlpWork) {
        let n = x.len() / self.hidden;
        let up = zeroed(&mut work.up, n * self.inter);
        let gate = zeroed(&mut work.gate, if self.gate.is_some() { n * self.inter } else { 0 });
        self.forward_with(x, &cpu::identity_rows(n), out, up, gate, cpu::linear_rows)
    }

    /// Applies the block to the rows of `x` listed in `rows`, into `out` (`[rows.len(), hidden]`),
    /// all on the calling thread (MoE runs one expert per task). `up` holds `rows.len() * inter`
    /// floats, as does `gate` for a gated block (else it may be empty).
    pub fn forward_rows_serial(
        &self,
        x: &[f32],
        rows: &[usize],
        out: &mut [f32],
        up: &mut [f32],
        gate: &mut [f32],
    ) {
        self.forward_with(x, rows, out, up, gate, cpu::linear_rows_serial)
    }

    fn forward_with(
        &self,
        x: &[f32],
        rows: &[usize],
        out: &mut [f32],
        up: &mut [f32],
        gate: &mut [f32],
        linear: fn(&[f32], &[usize], &Matrix, &mut [f32]),
    ) {
        linear(x, rows, &self.up, up);
        match (&self.gate, self.activation) {
            (Some(g), FfnActivation::SwiGlu) => {
                linear(x, rows, g, gate);
                cpu::mul_silu_inplace(up, gate);
            }
            (_, FfnActivation::Relu2) => cpu::relu2_inplace(up),
            (None, FfnActivation::SwiGlu) => unreachable!("SwiGLU blocks are built with a gate"),
        }
        linear(up, &cpu::identity_rows(rows.len()), &self.down, out);
    }
}
