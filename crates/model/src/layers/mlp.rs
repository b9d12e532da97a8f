//! A dense feed-forward block: SwiGLU (`down(silu(gate x) * up x)`) or squared ReLU
//! (`down(relu(up x)²)`). MoE experts are blocks of this kind.

use crate::config::FfnActivation;
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
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        let rows: Vec<usize> = (0..x.len() / self.hidden).collect();
        self.forward_rows(x, &rows, out);
    }

    /// Applies the block to the rows of `x` listed in `rows`, into `out` (`[rows.len(), hidden]`),
    /// all on the calling thread (MoE runs one expert per task).
    pub fn forward_rows_serial(&self, x: &[f32], rows: &[usize], out: &mut [f32]) {
        self.forward_with(x, rows, out, cpu::linear_rows_serial)
    }

    fn forward_rows(&self, x: &[f32], rows: &[usize], out: &mut [f32]) {
        self.forward_with(x, rows, out, cpu::linear_rows)
    }

    fn forward_with(
        &self,
        x: &[f32],
        rows: &[usize],
        out: &mut [f32],
        linear: fn(&[f32], &[usize], &Matrix, &mut [f32]),
    ) {
        let n = rows.len();
        let mut up = vec![0.0; n * self.inter];
        linear(x, rows, &self.up, &mut up);
        match (&self.gate, self.activation) {
            (Some(g), FfnActivation::SwiGlu) => {
                let mut gate = vec![0.0; n * self.inter];
                linear(x, rows, g, &mut gate);
                for (u, g) in up.iter_mut().zip(&gate) {
                    *u *= cpu::silu(*g);
                }
            }
            (_, FfnActivation::Relu2) => cpu::relu2_inplace(&mut up),
            (None, FfnActivation::SwiGlu) => unreachable!("SwiGLU blocks are built with a gate"),
        }
        let all: Vec<usize> = (0..n).collect();
        linear(&up, &all, &self.down, out);
    }
}
