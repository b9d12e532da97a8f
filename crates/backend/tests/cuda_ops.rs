//! Every CUDA op against its CPU reference, and the bitwise row-invariance of every op that
//! reduces. These need an NVIDIA GPU with a CUDA 13 driver; without one each test prints why it
//! skips and passes. `docs/gpu.md` says how to build them here and run them on a GPU machine, and
//! gives the tolerance table that `support::tol` writes down.
#![cfg(feature = "cuda")]

mod cuda_ops {
    pub mod attention;
    pub mod dense;
    pub mod graphs;
    pub mod mamba;
    pub mod mma;
    pub mod moe;
    pub mod moe_skew;
    pub mod peer;
    pub mod sampling;
    pub mod support;
}
