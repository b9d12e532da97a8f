//! Weight matrices as the CPU kernels read them: `f32`, or `bf16` kept as stored so decode reads
//! half the bytes. A `bf16` value widens to `f32` exactly, so both give bitwise the same results,
//! unless the matrix asks for products in bf16 precision ([`MatmulPrecision::Bf16`]).

use half::bf16;

/// A row-major weight matrix `[rows, cols]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: MatrixData,
    precision: MatmulPrecision,
}

/// The arithmetic of the products with a matrix's `bf16` weights. Both are deterministic and
/// batch invariant (a row's bits never depend on the other rows); they differ in what they round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MatmulPrecision {
    /// Weights widened to `f32` (exactly) and multiplied with `f32` inputs: the reference.
    #[default]
    F32,
    /// Inputs rounded to bf16 and multiplied with the bf16 weights by AVX-512 BF16 dot products,
    /// accumulating in `f32`: about twice the arithmetic rate where the CPU has them, at the
    /// cost of the inputs' low mantissa bits. Matrices stored as `f32` keep `F32`.
    Bf16,
}

impl MatmulPrecision {
    /// The name the command line uses (`f32`, `bf16`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for MatmulPrecision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(Self::F32),
            "bf16" => Ok(Self::Bf16),
            _ => Err(format!("unknown matmul precision {s:?} (expected f32 or bf16)")),
        }
    }
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
        Self { rows, cols, data, precision: MatmulPrecision::F32 }
    }

    /// Sets the precision of products with this matrix; `f32` storage stays exact.
    pub fn set_precision(&mut self, precision: MatmulPrecision) {
        if matches!(self.data, MatrixData::Bf16(_)) {
            self.precision = precision;
        }
    }

    /// The precision of products with this matrix.
    pub fn precision(&self) -> MatmulPrecision {
        self.precision
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
        Self { precision: self.precision, ..Self::new(range.len(), c, data) }
    }
}

/// An empty vector with room for `len` elements whose memory the kernel may back with
/// transparent huge pages. Weights are streamed end to end at every decode step; 2 MiB pages
/// spare that stream a page walk every 4 KiB. Only a hint (`MADV_HUGEPAGE` on the allocation's
/// whole 2 MiB pages, before they are touched): where the kernel declines, nothing changes.
pub fn streamed_vec<T>(len: usize) -> Vec<T> {
    let v = Vec::with_capacity(len);
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = v.as_ptr() as usize;
        let (first, end) =
            (start.next_multiple_of(HUGE), (start + len * size_of::<T>()) / HUGE * HUGE);
        if end > first {
            // SAFETY: the range lies inside the vector's untouched allocation, which the vector
            // owns; the advice changes only how the kernel backs those pages, never their contents.
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
        }
    }
    v
}
