//! `swiglu` spreads long inputs over the thread team in chunks; the result must be the
//! element-wise definition `g / (1 + exp(-g)) · u`, bit for bit, on and off a team and
//! for every length (below, at and across the chunk size, and not a multiple of it).

use onebit_kernels::elementwise::swiglu;
use onebit_kernels::team::Team;

fn inputs(len: usize, seed: u32) -> (Vec<f32>, Vec<f32>) {
    let value = |i: usize, s: u32| {
        ((i as u32).wrapping_mul(2654435761).wrapping_add(s) % 2000) as f32 / 250.0 - 4.0
    };
    (
        (0..len).map(|i| value(i, seed)).collect(),
        (0..len).map(|i| value(i, seed + 7)).collect(),
    )
}

fn definition(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| g / (1.0 + (-g).exp()) * u)
        .collect()
}

#[test]
fn swiglu_equals_its_element_wise_definition_on_and_off_a_team() {
    let team = Team::new(2, "swiglu-test").unwrap();
    for len in [0usize, 1, 383, 384, 385, 768, 1000, 1536, 4 * 1536 + 5] {
        let (gate, up) = inputs(len, len as u32);
        let want = definition(&gate, &up);
        let mut alone = gate.clone();
        swiglu(&mut alone, &up);
        assert_eq!(alone, want, "off a team, length {len}");
        let mut teamed = gate.clone();
        team.install(|| swiglu(&mut teamed, &up));
        assert_eq!(teamed, want, "on a team of 2, length {len}");
    }
}

#[test]
#[should_panic(expected = "swiglu: gate and up differ in length")]
fn swiglu_refuses_inputs_of_different_lengths() {
    let mut gate = vec![0f32; 10];
    swiglu(&mut gate, &[0f32; 9]);
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
