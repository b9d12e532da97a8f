//! Weight matrices as the CPU kernels read them: `f32`, or `bf16` kept as stored so decode reads
//! half the bytes. A `bf16` value widens to `f32` exactly, so both give bitwise the same results.

use half::bf16;

/// A row-major weight matrix `[rows, cols]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: MatrixData,
}

/// The element storage of a [`Matrix`].
#[derive(Clone, Debug, PartialEq)]
pub enum MatrixData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// bfloat16, widened to `f32` inside the kernels.
    Bf16(Vec<bf16>),
}

impl Matrix {
    /// A matrix over `data`, which must hold `rows * cols` values.
    pub fn new(rows: usize, cols: usize, data: MatrixData) -> Self {
        let len = match &data {
            MatrixData::F32(v) => v.len(),
            MatrixData::Bf16(v) => v.len(),
        };
        assert_eq!(len, rows * cols, "matrix data does not match [{rows}, {cols}]");
        Self { rows, cols, data }
    }

    /// An `f32` matrix.
    pub fn from_f32(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        Self::new(rows, cols, MatrixData::F32(data))
    }

    /// Rows (output features).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (input features).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The storage.
    pub fn data(&self) -> &MatrixData {
        &self.data
    }

    /// Bytes of weights (what a full pass over the matrix reads).
    pub fn bytes(&self) -> usize {
        match &self.data {
            MatrixData::F32(v) => v.len() * 4,
            MatrixData::Bf16(v) => v.len() * 2,
        }
    }

    /// Row `i` widened to `f32` into `out`.
    pub fn row_into(&self, i: usize, out: &mut [f32]) {
        let c = self.cols;
        match &self.data {
            MatrixData::F32(v) => out.copy_from_slice(&v[i * c..(i + 1) * c]),
            MatrixData::Bf16(v) => {
                out.iter_mut().zip(&v[i * c..(i + 1) * c]).for_each(|(o, w)| *o = w.to_f32())
            }
        }
    }

    /// Rows `range` as a new matrix (splitting fused weights).
    pub fn slice_rows(&self, range: std::ops::Range<usize>) -> Self {
        let c = self.cols;
        let data = match &self.data {
            MatrixData::F32(v) => MatrixData::F32(v[range.start * c..range.end * c].to_vec()),
            MatrixData::Bf16(v) => MatrixData::Bf16(v[range.start * c..range.end * c].to_vec()),
        };
        Self::new(range.len(), c, data)
    }
}
