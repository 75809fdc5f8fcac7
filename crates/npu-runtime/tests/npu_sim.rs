//! The NPU backend without an NPU: the dispatch plan, bit-exact weight packing, the
//! op-by-op comparison table, and whole forwards on the simulated device held to the
//! CPU backend's own tests (logits and taps bit for bit, batch verify, truncate).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use npu_runtime::kernels::{self, Isa};
use npu_runtime::npu::compare::{compare_ops, format_table};
use npu_runtime::npu::plan::{BufferRole, Elem, WeightSource, PAGE};
use npu_runtime::npu::{pack, DispatchPlan, NpuTarget, PlanOptions, SimDevice};
use npu_runtime::{CpuTarget, Forward, HeadKind, TapRows, TargetPackage};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn lcg(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *state >> 33
}

fn sim_target(package: &TargetPackage, max_rows: usize) -> NpuTarget<'_, SimDevice> {
    let mut options = PlanOptions::for_model(&package.config);
    options.max_rows = max_rows;
    options.context = 64;
    NpuTarget::new(package, SimDevice::new(Isa::detect()), options).unwrap()
}

#[test]
fn plan_lists_every_kernel_of_a_pass() {
    for (dir, per_layer) in [("tiny-llama", 16), ("tiny-qwen3", 16)] {
        let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
        let c = &package.config;
        let mut options = PlanOptions::for_model(c);
        options.taps = vec![0, c.num_layers - 1];
        let plan = DispatchPlan::build(c, &options).unwrap();
        // embed, per layer 16 ops, final norm, head, plus one tap copy per tap.
        assert_eq!(
            plan.steps.len(),
            1 + per_layer * c.num_layers + 2 + 2,
            "{dir}"
        );
        let counts: std::collections::BTreeMap<_, _> = plan.op_counts().into_iter().collect();
        assert_eq!(
            counts["matmul_q4"],
            7 * c.num_layers + 1,
            "{dir}: 7 projections a layer + head"
        );
        assert_eq!(counts["attention"], c.num_layers);
        assert_eq!(counts["tap_copy"], 2);
        assert_eq!(plan.kv.len(), c.num_layers);
        for &(k, v) in &plan.kv {
            for id in [k, v] {
                assert_eq!(plan.buffers[id].role, BufferRole::KvCache);
                assert_eq!(
                    plan.buffers[id].bytes,
                    c.num_kv_heads * options.context * c.head_dim * 4
                );
            }
        }
        // Every buffer an op binds exists, and weight buffers name their source.
        for step in &plan.steps {
            for (_, id) in step.op.buffers() {
                assert!(
                    id < plan.buffers.len(),
                    "{dir}: {} binds buffer {id}",
                    step.label
                );
            }
        }
        for b in &plan.buffers {
            assert_eq!(
                b.role == BufferRole::Weights,
                b.source.is_some(),
                "{}",
                b.name
            );
        }
        println!("{dir}: {}", plan.summary());
    }
    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let mut options = PlanOptions::for_model(&package.config);
    options.taps = vec![9];
    assert_eq!(
        DispatchPlan::build(&package.config, &options)
            .unwrap_err()
            .to_string(),
        "target: tap layer 9 does not exist (the model has 2 layers)"
    );
    options.taps.clear();
    options.context = package.config.max_positions + 1;
    assert!(DispatchPlan::build(&package.config, &options)
        .unwrap_err()
        .to_string()
        .contains("context"));
}

#[test]
fn weight_packing_is_bit_exact() {
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
        let c = &package.config;
        let weights = package.weights().unwrap();
        let mut options = PlanOptions::for_model(c);
        options.head = HeadKind::Tiles;
        options.context = 32;
        let plan = DispatchPlan::build(c, &options).unwrap();
        let mut checked = 0;
        for spec in plan
            .buffers
            .iter()
            .filter(|b| b.role == BufferRole::Weights)
        {
            let packed = pack::pack(c, &weights, spec, 32).unwrap();
            assert_eq!(packed.len(), spec.bytes, "{}", spec.name);
            let expected: Vec<u8> = match spec.source.unwrap() {
                WeightSource::Tiles { layer, projection } => {
                    let l = &weights.layers[layer];
                    use npu_runtime::npu::plan::Projection::*;
                    let m = match projection {
                        Q => &l.q,
                        K => &l.k,
                        V => &l.v,
                        O => &l.o,
                        Gate => &l.gate,
                        Up => &l.up,
                        Down => &l.down,
                    };
                    assert_eq!(
                        spec.bytes % PAGE,
                        0,
                        "{}: tile buffers are whole pages",
                        spec.name
                    );
                    // The device's view decodes to the same weights as the package's.
                    let view = pack::unpack_tiles(&spec.name, &packed, m.rows(), m.cols()).unwrap();
                    assert_eq!(view.decode(), m.decode(), "{}", spec.name);
                    m.bytes().to_vec()
                }
                WeightSource::HeadTiles => weights.lm_head.bytes().to_vec(),
                WeightSource::Embedding => weights.embed.bytes.to_vec(),
                WeightSource::Gain { layer, norm } => {
                    let l = &weights.layers[layer];
                    use npu_runtime::npu::plan::Norm::*;
                    let g = match norm {
                        Input => &l.input_norm,
                        Post => &l.post_norm,
                        Query => l.q_norm.as_ref().unwrap(),
                        Key => l.k_norm.as_ref().unwrap(),
                    };
                    g.iter().flat_map(|v| v.to_le_bytes()).collect()
                }
                WeightSource::FinalNorm => weights
                    .final_norm
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                WeightSource::RopeTable => {
                    let (mut cos, mut sin) = (Vec::new(), Vec::new());
                    for p in 0..32 {
                        let (c0, s0) = kernels::rope_table(c.rope_theta, c.head_dim, p);
                        cos.extend(c0);
                        sin.extend(s0);
                    }
                    cos.iter()
                        .chain(&sin)
                        .flat_map(|v| v.to_le_bytes())
                        .collect()
                }
            };
            assert!(
                packed[..expected.len()] == expected[..],
                "{dir}: {} differs from the package",
                spec.name
            );
            assert!(
                packed[expected.len()..].iter().all(|&b| b == 0),
                "{}: padding is zeros",
                spec.name
            );
            if spec.elem == Elem::Bytes {
                checked += 1;
            }
        }
        assert_eq!(
            checked,
            7 * c.num_layers + 2,
            "{dir}: every tile buffer and the embedding"
        );
    }
}

#[test]
fn sim_device_passes_the_op_by_op_comparison_bit_exact() {
    for kernel in Isa::available() {
        let mut device = SimDevice::new(kernel);
        let checks = compare_ops(&mut device).unwrap();
        println!(
            "{}",
            format_table(&format!("sim ({})", kernel.name()), &checks)
        );
        assert_eq!(checks.len(), npu_runtime::npu::plan::OP_KINDS.len());
        for c in &checks {
            assert!(c.passed(), "{}: NMSE {} over {}", c.op, c.nmse, c.limit);
            assert!(
                c.bit_exact,
                "sim {}: {} is not bit-exact",
                kernel.name(),
                c.op
            );
        }
    }
}

/// Logits and tap rows of the sim, pass for pass, equal the CPU backend's bits,
/// whatever the batch splits, the chunk size and the head.
#[test]
fn sim_forwards_equal_the_cpu_backend_bit_for_bit() {
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
        let vocab = package.config.vocab_size;
        let last = package.config.num_layers - 1;
        let mut rng = 11u64;
        let tokens: Vec<u32> = (0..40)
            .map(|_| (lcg(&mut rng) % vocab as u64) as u32)
            .collect();
        let mut cpu = CpuTarget::new(&package).unwrap();
        let cpu_sink = Arc::new(Mutex::new(TapRows::new(0)));
        cpu.set_layer_taps(&[last, 0], cpu_sink.clone()).unwrap();
        let cpu_logits = cpu.forward(&tokens).unwrap();
        let cpu_hidden = cpu.last_hidden().to_vec();

        for (max_rows, splits) in [
            (16, vec![40]),
            (3, vec![1, 8, 5, 1, 16, 9]),
            (8, vec![7; 5].into_iter().chain([5]).collect()),
        ] {
            let mut sim = sim_target(&package, max_rows);
            let sim_sink = Arc::new(Mutex::new(TapRows::new(0)));
            sim.set_layer_taps(&[last, 0], sim_sink.clone()).unwrap();
            let mut logits = Vec::new();
            let mut hidden = Vec::new();
            let mut at = 0;
            for len in splits.iter().copied() {
                logits.extend(sim.forward(&tokens[at..at + len]).unwrap());
                hidden.extend_from_slice(sim.last_hidden());
                at += len;
            }
            assert_eq!(at, 40);
            assert!(
                logits == cpu_logits,
                "{dir}: sim logits differ (max_rows {max_rows}, splits {splits:?})"
            );
            assert!(hidden == cpu_hidden, "{dir}: final hidden rows differ");
            assert!(
                *sim_sink.lock().unwrap() == *cpu_sink.lock().unwrap(),
                "{dir}: tap rows differ (max_rows {max_rows})"
            );
        }
    }
}

/// The speculative-decoding contract on the sim: an 8-row verify pass equals 8
/// single-token passes; truncate rolls back exactly; taps set mid-stream keep the KV.
#[test]
fn sim_verify_truncate_and_taps_behave_like_the_cpu_backend() {
    for dir in ["tiny-llama", "tiny-qwen3"] {
        let package = std::sync::Arc::new(TargetPackage::open(fixture(dir)).unwrap());
        let tokens: Vec<u32> = (0..30)
            .map(|i| (i * 37 % package.config.vocab_size) as u32)
            .collect();
        let vocab = package.config.vocab_size;

        let mut sim = sim_target(&package, 16);
        let full = sim.forward(&tokens[..20]).unwrap();
        let mut single = sim_target(&package, 16);
        let mut steps = Vec::new();
        for &t in &tokens[..20] {
            steps.extend(single.forward(&[t]).unwrap());
        }
        assert!(
            full == steps,
            "{dir}: batched pass differs from single steps"
        );

        // Verify 8 rows, reject the last 5, replay: the bits of the uninterrupted run.
        sim.truncate(12).unwrap();
        sim.forward(&tokens[20..28]).unwrap();
        sim.truncate(12).unwrap();
        assert_eq!(sim.position(), 12);
        let replay = sim.forward(&tokens[12..20]).unwrap();
        assert!(
            replay == full[12 * vocab..],
            "{dir}: replay after truncate differs"
        );
        assert_eq!(
            sim.truncate(21).unwrap_err().to_string(),
            "target: cannot truncate to 21 positions: only 20 are cached"
        );

        // Taps turned on after 20 positions: the plan is rebuilt, the KV survives.
        let mut cpu = CpuTarget::new(&package).unwrap();
        cpu.forward(&tokens[..20]).unwrap();
        let (cpu_sink, sim_sink) = (
            Arc::new(Mutex::new(TapRows::new(0))),
            Arc::new(Mutex::new(TapRows::new(0))),
        );
        cpu.set_layer_taps(&[1], cpu_sink.clone()).unwrap();
        sim.set_layer_taps(&[1], sim_sink.clone()).unwrap();
        assert!(
            cpu.forward(&tokens[20..30]).unwrap() == sim.forward(&tokens[20..30]).unwrap(),
            "{dir}: logits after enabling taps"
        );
        assert!(
            *cpu_sink.lock().unwrap() == *sim_sink.lock().unwrap(),
            "{dir}: tap rows"
        );
        assert_eq!(sim_sink.lock().unwrap().rows(), 10);
        assert!(cpu.embed(&[3, 4]).unwrap() == sim.embed(&[3, 4]).unwrap());
        let hidden = cpu.last_hidden().to_vec();
        assert!(cpu.lm_head(&hidden, 10) == sim.lm_head(&hidden, 10));

        // Refusals by name.
        assert_eq!(
            sim.forward(&[vocab as u32]).unwrap_err().to_string(),
            format!("target: token id {vocab} is outside the vocabulary of {vocab}")
        );
        assert_eq!(
            sim.forward(&[1; 40]).unwrap_err().to_string(),
            "target: a pass of 40 tokens at position 30 would exceed max_position_embeddings 64"
        );
    }
}

/// A whole forward with the embedding head, on both backends, on the tied tiny-llama:
/// prefill and a decode step, bit for bit; the embedding head really is in use (its
/// logits differ from the tiles').
#[test]
fn sim_runs_the_embedding_head_too() {
    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-llama")).unwrap());
    assert!(package.config.tie_word_embeddings, "tiny-llama is tied");
    let with_head = |head| npu_runtime::CpuOptions {
        head: Some(head),
        ..Default::default()
    };
    let mut cpu = CpuTarget::with_options(&package, with_head(HeadKind::Embedding)).unwrap();
    let mut tiles = CpuTarget::with_options(&package, with_head(HeadKind::Tiles)).unwrap();
    let mut options = PlanOptions::for_model(&package.config);
    options.head = HeadKind::Embedding;
    options.context = 16;
    let mut sim = NpuTarget::new(&package, SimDevice::new(Isa::detect()), options).unwrap();
    let prefill = cpu.forward(&[5, 6, 7]).unwrap();
    assert_eq!(prefill.len(), 3 * package.config.vocab_size);
    assert!(prefill == sim.forward(&[5, 6, 7]).unwrap());
    assert!(
        prefill != tiles.forward(&[5, 6, 7]).unwrap(),
        "the embedding head gave the tiles' logits"
    );
    assert!(cpu.forward(&[8]).unwrap() == sim.forward(&[8]).unwrap());
}

/// The embedding head on the untied tiny-qwen3: both backends refuse it by name.
#[test]
fn the_embedding_head_is_refused_on_an_untied_model() {
    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    assert!(!package.config.tie_word_embeddings, "tiny-qwen3 is untied");
    let mut options = PlanOptions::for_model(&package.config);
    options.head = HeadKind::Embedding;
    let refused = NpuTarget::new(&package, SimDevice::new(Isa::scalar()), options);
    let message = refused.err().unwrap().to_string();
    assert!(message.contains("tie_word_embeddings"), "{message}");
    let options = npu_runtime::CpuOptions {
        head: Some(HeadKind::Embedding),
        ..Default::default()
    };
    let message = CpuTarget::with_options(&package, options)
        .err()
        .unwrap()
        .to_string();
    assert!(message.contains("tie_word_embeddings"), "{message}");
}

#[test]
fn the_npu_device_without_xrt_says_so() {
    if xrt_sys_enabled() {
        test_support::skip!(
            "the_npu_device_without_xrt_says_so",
            "this build has the `xrt` feature"
        );
        return;
    }
    let err = npu_runtime::npu::open_npu(std::path::Path::new("kernels.json"), 0)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "target: this onebit was built without XRT support (cargo feature `xrt`)"
    );
}

fn xrt_sys_enabled() -> bool {
    cfg!(feature = "xrt")
}

/// A refused op (a token past the vocabulary) leaves the simulated device usable.
#[test]
fn sim_device_survives_a_refused_op() {
    use npu_runtime::npu::plan::{BufferSpec, Geometry, Op, PassArgs};
    use npu_runtime::npu::Device;
    let g = Geometry {
        hidden: 16,
        head_dim: 8,
        num_heads: 2,
        num_kv_heads: 1,
        vocab: 4,
        rms_eps: 1e-6,
        capacity: 8,
        max_rows: 2,
        taps: 0,
    };
    let spec = |name: &str, bytes: usize, elem: Elem| BufferSpec {
        name: name.into(),
        bytes,
        role: BufferRole::Activations,
        elem,
        source: None,
    };
    let buffers = [
        spec("table", 4 * 16 * 2, Elem::Bytes),
        spec("tokens", 8, Elem::Bytes),
        spec("out", 2 * 16 * 4, Elem::F32),
    ];
    let op = Op::Embed {
        table: 0,
        tokens: 1,
        out: 2,
    };
    let mut device = SimDevice::new(Isa::scalar());
    device
        .allocate(&buffers, std::slice::from_ref(&op))
        .unwrap();
    let table: Vec<u8> = (0..64u16)
        .flat_map(|i| half::bf16::from_f32(i as f32).to_le_bytes())
        .collect();
    device.write(0, 0, &table).unwrap();
    let pass = PassArgs {
        rows: 2,
        position: 0,
    };
    device.write(1, 0, &[1, 0, 0, 0, 9, 0, 0, 0]).unwrap();
    let err = device.run(&op, &g, pass).unwrap_err().to_string();
    assert!(err.contains("token 9 outside the vocabulary of 4"), "{err}");
    device.write(1, 0, &[1, 0, 0, 0, 3, 0, 0, 0]).unwrap();
    device.run(&op, &g, pass).unwrap();
    let mut out = vec![0u8; 2 * 16 * 4];
    device.read(2, 0, &mut out).unwrap();
    let values: Vec<f32> = out
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    assert_eq!(values[0], 16.0, "row 1 starts at table value 16");
    assert_eq!(values[16], 48.0, "row 3 starts at table value 48");
}

/// The sim device, the packer and the plan refuse bad requests by name.
#[test]
fn npu_refusals_are_named() {
    use npu_runtime::npu::plan::{BufferSpec, Geometry, Op, PassArgs, WeightSource};
    use npu_runtime::npu::Device;
    let spec = |name: &str, bytes: usize, elem: Elem, source: Option<WeightSource>| BufferSpec {
        name: name.into(),
        bytes,
        role: if source.is_some() {
            BufferRole::Weights
        } else {
            BufferRole::Activations
        },
        elem,
        source,
    };
    let mut device = SimDevice::new(Isa::scalar());
    let buffers = [
        spec("raw", 8, Elem::Bytes, None),
        spec("rows", 16, Elem::F32, None),
    ];
    device.allocate(&buffers, &[]).unwrap();
    let text = |r: npu_runtime::Result<()>| r.unwrap_err().to_string();
    assert_eq!(
        text(device.write(0, 4, &[0; 8])),
        "target: npu sim: write of 8 bytes at 4 overruns buffer raw"
    );
    assert_eq!(
        text(device.read(1, 8, &mut [0; 12])),
        "target: npu sim: read of 12 bytes at 8 overruns buffer rows"
    );
    assert_eq!(
        text(device.write(1, 2, &[0; 4])),
        "target: npu sim: unaligned write to f32 buffer rows"
    );
    assert_eq!(
        text(device.read(1, 0, &mut [0; 3])),
        "target: npu sim: unaligned read from f32 buffer rows"
    );
    assert_eq!(
        text(device.write(7, 0, &[])),
        "target: npu sim: no buffer 7"
    );
    let g = Geometry {
        hidden: 4,
        head_dim: 2,
        num_heads: 1,
        num_kv_heads: 1,
        vocab: 2,
        rms_eps: 1e-6,
        capacity: 2,
        max_rows: 1,
        taps: 0,
    };
    let pass = PassArgs {
        rows: 1,
        position: 0,
    };
    let swapped = Op::Add {
        x: 0,
        y: 1,
        width: 4,
    };
    assert_eq!(
        text(device.run(&swapped, &g, pass)),
        "target: npu sim: buffer raw holds bytes, not f32"
    );

    let package = std::sync::Arc::new(TargetPackage::open(fixture("tiny-llama")).unwrap());
    let weights = package.weights().unwrap();
    let c = &package.config;
    let not_weights = spec("x", 16, Elem::F32, None);
    assert_eq!(
        pack::pack(c, &weights, &not_weights, 8)
            .unwrap_err()
            .to_string(),
        "target: npu: buffer x is not a weight buffer"
    );
    let small = spec("final_norm", 4, Elem::F32, Some(WeightSource::FinalNorm));
    assert_eq!(
        pack::pack(c, &weights, &small, 8).unwrap_err().to_string(),
        format!(
            "target: npu: {} bytes of final_norm do not fit its 4-byte buffer",
            c.hidden_size * 4
        )
    );
    let beyond = spec(
        "layer99.input_norm",
        4096,
        Elem::F32,
        Some(WeightSource::Gain {
            layer: 99,
            norm: npu_runtime::npu::plan::Norm::Input,
        }),
    );
    assert_eq!(
        pack::pack(c, &weights, &beyond, 8).unwrap_err().to_string(),
        "target: npu: buffer layer99.input_norm names missing layer 99"
    );
    let q_norm = spec(
        "layer0.q_norm",
        4096,
        Elem::F32,
        Some(WeightSource::Gain {
            layer: 0,
            norm: npu_runtime::npu::plan::Norm::Query,
        }),
    );
    assert_eq!(
        pack::pack(c, &weights, &q_norm, 8).unwrap_err().to_string(),
        "target: npu: buffer layer0.q_norm needs a Query norm that layer 0 does not have"
    );
    assert_eq!(
        pack::unpack_tiles("w", &[0u8; 100], 32, 256)
            .unwrap_err()
            .to_string(),
        "target: npu: buffer w holds 100 bytes, fewer than the 5120 of a 32 x 256 tile grid"
    );
    let mut options = PlanOptions::for_model(c);
    options.max_rows = 0;
    assert_eq!(
        DispatchPlan::build(c, &options).unwrap_err().to_string(),
        "target: npu plan: max_rows must be at least 1"
    );
}
