//! The gated activations (`swiglu`, `geglu`) spread long inputs over the thread team in
//! chunks and are compiled for each ISA; the result must be the element-wise definition
//! (`silu(g) · u`, `gelu_tanh(g) · u` by the scalar functions), bit for bit, on and off a
//! team, on every ISA this CPU has, and for every length. The fixed-sequence `exp` and
//! the activations are held to `f64` within their stated errors.

use onebit_kernels::elementwise::{exp_nonpositive, gated, gelu_tanh, silu, swiglu, Gate, EXP_MIN};
use onebit_kernels::team::Team;
use onebit_kernels::Isa;

fn inputs(len: usize, seed: u32) -> (Vec<f32>, Vec<f32>) {
    let value = |i: usize, s: u32| {
        ((i as u32).wrapping_mul(2654435761).wrapping_add(s) % 2000) as f32 / 50.0 - 20.0
    };
    (
        (0..len).map(|i| value(i, seed)).collect(),
        (0..len).map(|i| value(i, seed + 7)).collect(),
    )
}

fn definition(activation: Gate, gate: &[f32], up: &[f32]) -> Vec<f32> {
    let f = match activation {
        Gate::Silu => silu,
        Gate::GeluTanh => gelu_tanh,
    };
    gate.iter().zip(up).map(|(&g, &u)| f(g) * u).collect()
}

#[test]
fn gated_activations_equal_their_element_wise_definition_on_every_isa_and_team() {
    let team = Team::new(2, "gated-test").unwrap();
    for activation in [Gate::Silu, Gate::GeluTanh] {
        for len in [0usize, 1, 15, 17, 2047, 2048, 2049, 4096, 4 * 1536 + 5] {
            let (mut gate, up) = inputs(len, len as u32);
            // Specials: NaN, infinities, zeros, the clamp's edge, huge and tiny values.
            for (i, v) in [
                f32::NAN,
                f32::INFINITY,
                -0.0,
                0.0,
                EXP_MIN,
                -EXP_MIN,
                -88.5,
                1e30,
                -1e30,
                1e-40,
            ]
            .into_iter()
            .enumerate()
            {
                if i < len {
                    gate[i] = v;
                }
            }
            let want = definition(activation, &gate, &up);
            for isa in Isa::available() {
                let mut alone = gate.clone();
                gated(isa, activation, &mut alone, &up);
                let mut teamed = gate.clone();
                team.install(|| gated(isa, activation, &mut teamed, &up));
                for (got, how) in [(alone, "off a team"), (teamed, "on a team of 2")] {
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()));
                    assert!(same, "{activation:?} {}: {how}, length {len}", isa.name());
                }
            }
        }
    }
}

#[test]
fn exp_is_within_its_stated_error() {
    // Every 2^-12 step over [EXP_MIN, 0], and the edges.
    let mut worst = 0f64;
    let steps = (-EXP_MIN as f64 * 4096.0) as i64;
    for i in 0..=steps {
        let a = -(i as f64) / 4096.0;
        let a = a.max(EXP_MIN as f64) as f32;
        let want = (a as f64).exp();
        let got = exp_nonpositive(a) as f64;
        worst = worst.max(((got - want) / want).abs());
    }
    // Measured 8.3e-8 (under one f32 ulp of the result); bound: 2e-7.
    eprintln!("exp relative error {worst:e}");
    assert!(worst < 2e-7, "relative error {worst:e}");
    assert_eq!(exp_nonpositive(EXP_MIN - 0.5), 0.0);
    assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_nonpositive(f32::NAN), 0.0);
    assert_eq!(exp_nonpositive(0.0), 1.0);
    assert_eq!(exp_nonpositive(-0.0), 1.0);
}

#[test]
fn activations_are_within_their_stated_error_of_f64() {
    let (mut silu_worst, mut gelu_worst) = (0f64, 0f64);
    for i in -200_000..=200_000 {
        let x = i as f32 / 5000.0; // [-40, 40]
        let xd = x as f64;
        let silu_want = xd / (1.0 + (-xd).exp());
        let inner = 0.797_884_560_802_865_4 * (xd + 0.044_715 * xd * xd * xd);
        let gelu_want = 0.5 * xd * (1.0 + inner.tanh());
        // Absolute error scaled by max(1, |x|): what a following projection sees.
        let scale = xd.abs().max(1.0);
        silu_worst = silu_worst.max((silu(x) as f64 - silu_want).abs() / scale);
        gelu_worst = gelu_worst.max((gelu_tanh(x) as f64 - gelu_want).abs() / scale);
    }
    // Measured 1.14e-7 and 1.17e-7 (about one f32 ulp of max(1, |x|)); bound: 3e-7.
    eprintln!("silu {silu_worst:e} gelu {gelu_worst:e}");
    assert!(silu_worst < 3e-7, "silu error {silu_worst:e}");
    assert!(gelu_worst < 3e-7, "gelu error {gelu_worst:e}");
    assert!(silu(f32::NAN).is_nan() && gelu_tanh(f32::NAN).is_nan());
    assert_eq!(silu(f32::INFINITY), f32::INFINITY);
    assert_eq!(silu(-100.0), 0.0); // e^-100 is below EXP_MIN: flushed
}

#[test]
#[should_panic(expected = "swiglu: gate and up differ in length")]
fn swiglu_refuses_inputs_of_different_lengths() {
    let mut gate = vec![0f32; 10];
    swiglu(Isa::detect(), &mut gate, &[0f32; 9]);
}

/// The plain definition: the first index whose value is the largest number.
fn first_max_definition(values: &[f32]) -> usize {
    let mut best: Option<usize> = None;
    for (i, &v) in values.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|b| v > values[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0)
}

#[test]
fn first_max_is_the_first_index_of_the_largest_number_on_every_isa() {
    use onebit_kernels::elementwise::first_max;
    use onebit_kernels::Isa;
    let mut state = 7u64;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as u32
    };
    let isas = Isa::available();
    eprintln!(
        "first_max compiled for: {}",
        isas.iter().map(|i| i.name()).collect::<Vec<_>>().join(", ")
    );
    for len in [1usize, 2, 15, 16, 17, 33, 100, 1000] {
        for trial in 0..200 {
            // A small alphabet makes ties; some NaN and infinities.
            let values: Vec<f32> = (0..len)
                .map(|_| match next() % 20 {
                    0 => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 if trial % 7 == 0 => f32::INFINITY,
                    r => (r % 9) as f32 - 4.0,
                })
                .collect();
            for &isa in &isas {
                assert_eq!(
                    first_max(isa, &values),
                    first_max_definition(&values),
                    "{}: {values:?}",
                    isa.name()
                );
            }
        }
    }
    for &isa in &isas {
        assert_eq!(first_max(isa, &[f32::NAN, f32::NAN]), 0, "no number: 0");
        assert_eq!(
            first_max(isa, &[f32::NAN, 1.0, 3.0, 3.0]),
            2,
            "NaN first is skipped"
        );
        assert_eq!(first_max(isa, &[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(first_max(isa, &[]), 0, "empty: 0");
    }
}

/// `rms_norm` of many rows (their sums of squares interleaved) equals each row normed by
/// the definition: one f32 accumulator from 0, squares added in index order, then
/// `g · (v · (1 / sqrt(ss / width + eps)))`, bit for bit, for every row count up to past
/// two interleaved blocks, widths of 1 to 577, and rows of very different scales.
#[test]
fn rms_norm_rows_equal_the_row_by_row_definition() {
    fn definition(row: &[f32], gain: &[f32], eps: f32) -> Vec<f32> {
        let mut ss = 0f32;
        for &v in row {
            ss += v * v;
        }
        let inv = 1.0 / (ss / row.len() as f32 + eps).sqrt();
        row.iter().zip(gain).map(|(&v, &g)| g * (v * inv)).collect()
    }
    for width in [1, 7, 64, 576, 577] {
        let (gain, _) = inputs(width, 3);
        for rows in 0..=2 * onebit_kernels::elementwise::NORM_ROWS + 1 {
            let (mut x, _) = inputs(rows * width, 11 + rows as u32);
            // Rows scaled over nine orders of magnitude: rounding differs row by row.
            for (r, row) in x.chunks_exact_mut(width).enumerate() {
                let scale = 10f32.powi(r as i32 % 10 - 5);
                row.iter_mut().for_each(|v| *v *= scale);
            }
            let mut out = vec![f32::NAN; rows * width];
            onebit_kernels::elementwise::rms_norm(&x, &gain, 1e-6, &mut out);
            for (r, (row, got)) in x
                .chunks_exact(width)
                .zip(out.chunks_exact(width))
                .enumerate()
            {
                let want = definition(row, &gain, 1e-6);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "width {width}, {rows} rows: row {r} differs from the definition"
                );
            }
        }
    }
    // Rows of `x` and `out` pair off as far as both go (whole rows only); no gain, no rows.
    let (x, _) = inputs(3 * 64 + 5, 2);
    let (gain, _) = inputs(64, 4);
    let mut out = vec![f32::NAN; 2 * 64 + 7];
    onebit_kernels::elementwise::rms_norm(&x, &gain, 1e-6, &mut out);
    assert!(
        out[..2 * 64].iter().all(|v| !v.is_nan()),
        "both whole rows of out are written"
    );
    assert!(
        out[2 * 64..].iter().all(|v| v.is_nan()),
        "a partial row is not"
    );
    let mut untouched = vec![f32::NAN; 8];
    onebit_kernels::elementwise::rms_norm(&x[..8], &[], 1e-6, &mut untouched);
    assert!(untouched.iter().all(|v| v.is_nan()));
}
