//! The encoder's int8 matrix products, kernel by kernel, against the `f32`
//! product the float encoder runs (Burn's CPU backend) in the same run, on
//! one thread, at the shapes of all-MiniLM-L6-v2's four dense layers.
//!
//! ```text
//! cargo run --release -p flotilla-benches --bin int8_kernels -- --rows 1024
//! ```
//!
//! Prints, per shape, GMAC/s (multiply-accumulates per second) of the `f32`
//! product and of every int8 kernel this CPU runs (`Vnni`: AVX-512 VNNI,
//! `Avx2`: AVX2 on 16-bit values, `Portable`: the compiler's vectorisation),
//! and each kernel's ratio to `f32`. Activation quantization is timed with
//! the kernels, as the encoder pays it. First it measures one thread's `f32`
//! FMA peak (AVX-512 and AVX2: independent FMA chains, no memory traffic),
//! and gives each `f32` product's rate as a share of the widest.

use std::time::Instant;

use burn::tensor::{Device, Tensor, TensorData};
use clap::Parser;
use flotilla_benches::arithmetic::fma_peaks;
use flotilla_embed::int8_gemm::{Int8Matrix, Int8Rows, Kernel, matmul_with};

#[derive(Parser)]
struct Args {
    /// Rows of the activations (tokens in a batch).
    #[arg(long, default_value_t = 1024)]
    rows: usize,
    /// Timed repetitions per measurement (the best is kept).
    #[arg(long, default_value_t = 5)]
    repeat: usize,
}

/// Deterministic values in `[-spread/2, spread/2)`.
fn values(n: usize, seed: u64, spread: f32) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * spread
        })
        .collect()
}

/// The best of `repeat` timings of `run`, in seconds.
fn best(repeat: usize, mut run: impl FnMut()) -> f64 {
    run();
    (0..repeat)
        .map(|_| {
            let t = Instant::now();
            run();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let device = Device::flex();
    let kernels = Kernel::available();
    println!(
        "{} rows, one thread; int8 kernels on this CPU: {kernels:?} (chosen: {:?})",
        args.rows,
        Kernel::detect()
    );
    let peaks = fma_peaks();
    for (width, rate) in &peaks {
        println!("f32 FMA peak, {width}: {rate:.1} GMAC/s");
    }
    let peak = peaks.first().map_or(f64::NAN, |p| p.1);
    print!("{:<18} {:>16}", "shape k×n", "f32 GMAC/s (peak)");
    for k in &kernels {
        print!(" {:>16}", format!("{k:?} GMAC/s"));
    }
    println!();
    for (name, k, n) in [
        ("qkv", 384, 1152),
        ("attention out", 384, 384),
        ("ffn in", 384, 1536),
        ("ffn out", 1536, 384),
    ] {
        let rows = args.rows;
        let macs = (rows * k * n) as f64;
        let weight = values(k * n, 7, 0.2);
        let bias = values(n, 3, 0.2);
        let x = values(rows * k, 11, 4.0);
        let f32_rate = pool.install(|| {
            let a = Tensor::<2>::from_data(TensorData::new(x.clone(), [rows, k]), &device);
            let b = Tensor::<2>::from_data(TensorData::new(weight.clone(), [k, n]), &device);
            macs / best(args.repeat, || {
                let _ = a.clone().matmul(b.clone()).into_data();
            }) / 1e9
        });
        print!(
            "{:<18} {:>16}",
            format!("{name} {k}×{n}"),
            format!("{f32_rate:.1} ({:.0}%)", 100.0 * f32_rate / peak)
        );
        let w = Int8Matrix::quantize(&weight, &bias, k, n);
        let mut q = Int8Rows::default();
        let mut out = vec![0.0f32; rows * n];
        for &kernel in &kernels {
            let rate = pool.install(|| {
                macs / best(args.repeat, || {
                    q.quantize_from(&x, k, None);
                    matmul_with(kernel, &w, &q, &mut out);
                }) / 1e9
            });
            print!(" {:>16}", format!("{rate:.1} ({:.2}x)", rate / f32_rate));
        }
        println!();
    }
    Ok(())
}
