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
