//! The engine over the tiny fixtures: generation equals the loop run directly, prefix
//! reuse never changes the text, cancellation and sinks stop it, drafting keeps the
//! text, refusals name their values, and incremental detokenization equals decoding the
//! whole output.

use std::ops::ControlFlow;
use std::path::PathBuf;

use onebit_engine::{
    CancelFlag, ContextLen, Detokenizer, DraftMode, DrafterConfig, Engine, EngineConfig,
    EngineError, Event, NullSink, Oracle, OracleRule, Prompt, Request, StopReason, Text,
};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures")
        .join(name)
}

fn config(name: &str) -> EngineConfig {
    let mut c = EngineConfig::new(fixture(name));
    c.threads = Some(1);
    c
}

fn greedy(ids: &[u32], n: usize) -> Request {
    Request {
        ignore_eos: true,
        ..Request::new(Prompt::Tokens(ids.to_vec()), n)
    }
}

const PROMPT: [u32; 6] = [1, 7, 99, 300, 42, 17];

#[test]
fn generation_equals_the_loop_run_directly() {
    let engine = Engine::load(&config("tiny-qwen3")).unwrap();
    let mut session = engine.session().unwrap();
    let done = session
        .generate(&greedy(&PROMPT, 20), &mut NullSink, &CancelFlag::new())
        .unwrap();
    let package =
        std::sync::Arc::new(npu_runtime::TargetPackage::open(fixture("tiny-qwen3")).unwrap());
    let mut target = npu_runtime::CpuTarget::with_options(
        &package,
        npu_runtime::CpuOptions {
            threads: Some(1),
            precision: npu_runtime::Precision::auto(),
            ..npu_runtime::CpuOptions::default()
        },
    )
    .unwrap();
    let options = mtp::RunOptions {
        max_tokens: 20,
        draft_max: 0,
        stop_tokens: Vec::new(),
        sampling: greedy(&PROMPT, 20).sampling,
        adaptive: None,
    };
    let direct = mtp::run(&mut target, None, &PROMPT, &options, &mut |_| true).unwrap();
    assert_eq!(done.tokens, direct.tokens);
    assert_eq!(done.stop, StopReason::Length);
    assert_eq!(done.prompt_tokens, PROMPT.len());
    assert_eq!(done.cached_tokens, 0);
    assert!(!done.drafted);
}

#[test]
fn a_prompt_extending_the_history_runs_only_the_new_tokens() {
    let engine = Engine::load(&config("tiny-qwen3")).unwrap();
    let mut session = engine.session().unwrap();
    let first = session
        .generate(&greedy(&PROMPT, 10), &mut NullSink, &CancelFlag::new())
        .unwrap();
    // The next turn: the whole first exchange, then new tokens.
    let mut next: Vec<u32> = PROMPT.to_vec();
    next.extend(&first.tokens);
    next.extend([5, 6, 7]);
    let second = session
        .generate(&greedy(&next, 10), &mut NullSink, &CancelFlag::new())
        .unwrap();
    // All but the last emitted token was run through the target.
    assert_eq!(second.cached_tokens, PROMPT.len() + first.tokens.len() - 1);
    let mut fresh = engine.session().unwrap();
    let reference = fresh
        .generate(&greedy(&next, 10), &mut NullSink, &CancelFlag::new())
        .unwrap();
    assert_eq!(reference.cached_tokens, 0);
    assert_eq!(second.tokens, reference.tokens);
    // A prompt that diverges is cut back to the common prefix.
    let mut other = PROMPT[..3].to_vec();
    other.extend([400, 401]);
    let third = session
        .generate(&greedy(&other, 6), &mut NullSink, &CancelFlag::new())
        .unwrap();
    assert_eq!(third.cached_tokens, 3);
    let mut fresh = engine.session().unwrap();
    let reference = fresh
        .generate(&greedy(&other, 6), &mut NullSink, &CancelFlag::new())
        .unwrap();
    assert_eq!(third.tokens, reference.tokens);
    // The same prompt again: everything but its last token is reused.
    let again = session
        .generate(&greedy(&other, 6), &mut NullSink, &CancelFlag::new())
        .unwrap();
    assert_eq!(again.cached_tokens, other.len() - 1);
    assert_eq!(again.tokens, reference.tokens);
}

#[test]
fn cancellation_and_the_sink_stop_a_generation() {
    let engine = Engine::load(&config("tiny-qwen3")).unwrap();
    let mut session = engine.session().unwrap();
    let cancel = CancelFlag::new();
    cancel.cancel();
    let done = session
        .generate(&greedy(&PROMPT, 20), &mut NullSink, &cancel)
        .unwrap();
    assert_eq!(done.stop, StopReason::Cancelled);
    assert!(done.tokens.is_empty());
    let mut seen = 0;
    let mut sink = |e: Event<'_>| {
        if let Event::Token { .. } = e {
            seen += 1;
        }
        if seen == 3 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let done = session
        .generate(&greedy(&PROMPT, 20), &mut sink, &CancelFlag::new())
        .unwrap();
    assert_eq!(done.stop, StopReason::Cancelled);
    assert_eq!(done.tokens.len(), 3);
    // The flag set mid-generation (here by the sink, as another thread would): the
    // generation stops at the next token.
    let flag = CancelFlag::new();
    let mut seen = 0;
    let mut cancelling = |e: Event<'_>| {
        if let Event::Token { .. } = e {
            seen += 1;
        }
        if seen == 3 {
            flag.cancel();
        }
        ControlFlow::Continue(())
    };
    let stopped = session
        .generate(&greedy(&PROMPT, 20), &mut cancelling, &flag)
        .unwrap();
    assert_eq!(stopped.stop, StopReason::Cancelled);
    assert!(stopped.tokens.len() <= 4, "{:?}", stopped.tokens);
    // The session is fine afterwards and its history matches what it holds.
    let full = session
        .generate(&greedy(&PROMPT, 20), &mut NullSink, &CancelFlag::new())
        .unwrap();
    assert_eq!(&full.tokens[..3], &done.tokens[..]);
    assert_eq!(full.tokens.len(), 20);
}

#[test]
fn lookup_drafting_keeps_the_text_and_reports_its_drafts() {
    let mut c = config("tiny-qwen3");
    c.drafter = DrafterConfig::Lookup { ngram: 3 };
    c.draft_max = 4;
    let engine = Engine::load(&c).unwrap();
    // A repetitive prompt, so lookup finds something to draft.
    let prompt: Vec<u32> = (0..40).map(|i| [5u32, 6, 7, 8][i % 4]).collect();
    let mut session = engine.session().unwrap();
    for mode in [DraftMode::Fixed(4), DraftMode::Auto] {
        session.reset();
        let mut plain_req = greedy(&prompt, 30);
        plain_req.draft = DraftMode::Off;
        let plain = session
            .generate(&plain_req, &mut NullSink, &CancelFlag::new())
            .unwrap();
        session.reset();
        let mut req = greedy(&prompt, 30);
        req.draft = mode;
        let spec = session
            .generate(&req, &mut NullSink, &CancelFlag::new())
            .unwrap();
        assert!(spec.drafted);
        assert_eq!(spec.tokens, plain.tokens, "{mode:?}");
        // Lookup drafted every round, and its counters are the run's. Fixed k drafts
        // for certain; adaptive k may choose plain steps throughout when the pass costs
        // it timed make extra rows dear (a busy machine), and then no drafter is named.
        let s = &spec.stats;
        if matches!(mode, DraftMode::Fixed(_)) {
            assert!(s.rounds > 0, "{mode:?}: {s:?}");
        }
        let by: Vec<_> = s
            .by_drafter
            .iter()
            .map(|d| (d.name, d.rounds, d.drafted, d.accepted))
            .collect();
        let expected: &[_] = if s.rounds > 0 {
            &[("lookup", s.rounds, s.drafted, s.accepted)]
        } else {
            &[]
        };
        assert_eq!(by, expected, "{mode:?}");
        assert!(plain.stats.by_drafter.is_empty());
    }
}

/// An oracle drafter (`Session::generate_oracle`, what `run --oracle` and `bench
/// --oracle` measure with) on an engine without a drafter: the text is plain decoding's
/// under every rule; always right accepts every draft, never right none; the counters
/// name the oracle; adaptive k calibrates on the spot.
#[test]
fn oracle_runs_keep_the_text_and_accept_by_their_rule() {
    let mut c = config("tiny-qwen3");
    c.draft_max = 4;
    let engine = Engine::load(&c).unwrap();
    assert!(!engine.drafting());
    let mut session = engine.session().unwrap();
    let mut plain_req = greedy(&PROMPT, 24);
    plain_req.draft = DraftMode::Off;
    let plain = session
        .generate(&plain_req, &mut NullSink, &CancelFlag::new())
        .unwrap();
    for (rule, mode) in [
        (OracleRule::Always, DraftMode::Fixed(4)),
        (OracleRule::EveryThirdWrong, DraftMode::Fixed(3)),
        (OracleRule::Never, DraftMode::Fixed(4)),
        (OracleRule::EveryThirdWrong, DraftMode::Auto),
    ] {
        let oracle = Oracle {
            rule,
            continuation: plain.tokens.clone(),
        };
        let mut req = greedy(&PROMPT, 24);
        req.draft = mode;
        session.reset();
        let spec = session
            .generate_oracle(&req, &oracle, &mut NullSink, &CancelFlag::new())
            .unwrap();
        assert_eq!(spec.tokens, plain.tokens, "{rule:?} {mode:?}");
        let s = &spec.stats;
        assert!(spec.drafted);
        let by: Vec<_> = s.by_drafter.iter().map(|d| (d.name, d.rounds)).collect();
        if s.rounds > 0 {
            assert_eq!(by, [("oracle", s.rounds)], "{rule:?} {mode:?}");
        }
        match (rule, mode) {
            (OracleRule::Always, _) => {
                assert!(s.rounds > 0);
                assert_eq!(s.accepted, s.drafted, "{s:?}");
            }
            (OracleRule::Never, _) => {
                assert!(s.rounds > 0);
                assert_eq!(s.accepted, 0, "{s:?}");
            }
            (_, DraftMode::Fixed(_)) => assert!(0 < s.accepted && s.accepted < s.drafted, "{s:?}"),
            _ => {}
        }
    }
    // A drafting mode that names one of the engine's drafters does not apply.
    let mut req = greedy(&PROMPT, 4);
    req.draft = DraftMode::LookupOnly;
    let oracle = Oracle {
        rule: OracleRule::Always,
        continuation: plain.tokens.clone(),
    };
    let e = session
        .generate_oracle(&req, &oracle, &mut NullSink, &CancelFlag::new())
        .unwrap_err();
    assert!(e.to_string().contains("LookupOnly"), "{e}");
}

/// Log-probabilities: a generated token's values (from the pass that picked it: the
/// prefill's last row, a plain step, or a verify row) equal, bit for bit, the prompt
/// log-probabilities of the same tokens scored as a prompt (full-logit passes over the
/// whole text); the streamed ones are the completion's; drafting (lookup, fixed and
/// adaptive k) changes none of them; more than 20 alternatives are refused by name.
#[test]
fn logprobs_equal_the_prompts_and_drafting_changes_none() {
    let mut c = config("tiny-qwen3");
    c.drafter = DrafterConfig::Lookup { ngram: 3 };
    c.draft_max = 4;
    let engine = Engine::load(&c).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| [5u32, 6, 7, 8][i % 4]).collect();
    let mut session = engine.session().unwrap();
    let mut plain_req = greedy(&prompt, 30);
    plain_req.draft = DraftMode::Off;
    plain_req.logprobs = Some(5);
    let mut streamed = Vec::new();
    let mut sink = |e: Event<'_>| {
        if let Event::Token { logprob, .. } = e {
            streamed.push(logprob.cloned());
        }
        ControlFlow::Continue(())
    };
    let plain = session
        .generate(&plain_req, &mut sink, &CancelFlag::new())
        .unwrap();
    assert_eq!(plain.logprobs.len(), 30);
    assert!(plain.prompt_logprobs.is_empty(), "not asked for");
    let streamed: Vec<_> = streamed.into_iter().map(Option::unwrap).collect();
    assert_eq!(streamed, plain.logprobs);
    for (lp, &t) in plain.logprobs.iter().zip(&plain.tokens) {
        assert_eq!(lp.token, t);
        assert_eq!(lp.top.len(), 5);
        assert_eq!(lp.top[0], (t, lp.logprob), "greedy picks the most likely");
    }
    // The same tokens as a prompt (a session holding them already: nothing is reused).
    let text: Vec<u32> = prompt.iter().chain(&plain.tokens).copied().collect();
    let mut scored_req = greedy(&text, 0);
    scored_req.draft = DraftMode::Off;
    scored_req.logprobs = Some(5);
    scored_req.prompt_logprobs = true;
    let scored = session
        .generate(&scored_req, &mut NullSink, &CancelFlag::new())
        .unwrap();
    assert_eq!(scored.cached_tokens, 0);
    assert!(scored.tokens.is_empty() && scored.logprobs.is_empty());
    assert_eq!(scored.prompt_logprobs.len(), text.len());
    assert_eq!(scored.prompt_logprobs[0], None);
    for (i, lp) in scored.prompt_logprobs.iter().enumerate().skip(1) {
        assert_eq!(lp.as_ref().unwrap().token, text[i]);
    }
    let tail: Vec<_> = scored.prompt_logprobs[prompt.len()..]
        .iter()
        .map(|l| l.clone().unwrap())
        .collect();
    assert_eq!(tail, plain.logprobs, "bit for bit");
    for mode in [DraftMode::Fixed(4), DraftMode::Auto] {
        let mut req = plain_req.clone();
        req.draft = mode;
        let spec = session
            .generate(&req, &mut NullSink, &CancelFlag::new())
            .unwrap();
        // Fixed k drafts (and lookup is right here) for certain; adaptive k may take
        // plain steps throughout when its timed pass costs say extra rows are dear.
        if matches!(mode, DraftMode::Fixed(_)) {
            assert!(spec.stats.accepted > 0, "{mode:?}: {:?}", spec.stats);
        }
        assert_eq!(spec.logprobs, plain.logprobs, "{mode:?}");
    }
    let mut too_many = plain_req.clone();
    too_many.logprobs = Some(21);
    let e = session
        .generate(&too_many, &mut NullSink, &CancelFlag::new())
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "logprobs: at most 20 alternatives a token, got 21"
    );
}

#[test]
fn refusals_name_their_values() {
    let mut c = config("tiny-qwen3");
    c.ctx_len = ContextLen::Exactly(64);
    let engine = Engine::load(&c).unwrap();
    let mut session = engine.session().unwrap();
    let err = session
        .generate(&greedy(&PROMPT, 60), &mut NullSink, &CancelFlag::new())
        .unwrap_err();
    assert!(
        matches!(err, EngineError::ContextOverflow { .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "the prompt (6 tokens) plus max_tokens (60) exceeds the context size (64 tokens)"
    );
    let err = session
        .generate(&greedy(&[1, 512], 2), &mut NullSink, &CancelFlag::new())
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "target: token id 512 is outside the vocabulary of 512"
    );
    let err = session
        .generate(&greedy(&[], 2), &mut NullSink, &CancelFlag::new())
        .unwrap_err();
    assert_eq!(err.to_string(), "the prompt is empty");
    let mut bad = greedy(&PROMPT, 2);
    bad.sampling.temperature = f32::NAN;
    let err = session
        .generate(&bad, &mut NullSink, &CancelFlag::new())
        .unwrap_err();
    assert!(err.to_string().contains("temperature"), "{err}");
    // --threads 0.
    let mut c = config("tiny-qwen3");
    c.threads = Some(0);
    let err = Engine::load(&c).err().unwrap();
    assert_eq!(err.to_string(), "--threads must be at least 1");
}

#[test]
fn a_corrupt_tokenizer_is_an_error_not_no_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "model.q4nx"] {
        std::fs::copy(fixture("tiny-qwen3").join(f), dir.path().join(f)).unwrap();
    }
    // No tokenizer: token ids work, text is refused by name.
    let mut c = EngineConfig::new(dir.path());
    c.threads = Some(1);
    let engine = Engine::load(&c).unwrap();
    assert!(engine.text().is_none());
    let err = engine.tokenize(&Prompt::Text("hi".into())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "the package has no tokenizer.json: give the prompt as token ids"
    );
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3").unwrap();
    let err = Engine::load(&c).err().unwrap();
    assert!(
        err.to_string()
            .contains("tokenizer.json: cannot load the tokenizer"),
        "{err}"
    );
}

#[test]
fn incremental_detokenization_equals_decoding_the_whole_output() {
    let text = Text::open(&fixture("tiny-qwen3")).unwrap().unwrap();
    // Every id in turn, and a pseudo-random walk.
    let mut ids: Vec<u32> = (0..512).collect();
    let mut x = 12345u32;
    for _ in 0..2000 {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
        ids.push((x >> 8) % 512);
    }
    let mut detok = Detokenizer::default();
    let mut streamed = String::new();
    for &id in &ids {
        streamed.push_str(&detok.push(&text, id).unwrap());
    }
    streamed.push_str(&detok.flush(&text).unwrap());
    assert_eq!(streamed, text.decode(&ids).unwrap());
}

/// A byte-level BPE tokenizer with one token per byte and no merges (GPT-2's
/// byte-to-character table), so every multi-byte character spans several tokens.
fn bytes_tokenizer(dir: &std::path::Path) -> Text {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut chars = vec!['\0'; 256];
    for &b in &printable {
        chars[b as usize] = char::from_u32(b).unwrap();
    }
    let mut n = 0;
    for b in 0..256u32 {
        if !printable.contains(&b) {
            chars[b as usize] = char::from_u32(256 + n).unwrap();
            printable.push(b);
            n += 1;
        }
    }
    let vocab: serde_json::Map<String, serde_json::Value> = chars
        .iter()
        .enumerate()
        .map(|(i, c)| (c.to_string(), serde_json::json!(i)))
        .collect();
    let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false});
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": null,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": []},
    });
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    Text::open(dir).unwrap().unwrap()
}

#[test]
fn a_utf8_sequence_split_across_tokens_is_held_back_until_complete() {
    let dir = tempfile::tempdir().unwrap();
    let text = bytes_tokenizer(dir.path());
    let sample = "ab é → 🦀 漢字!";
    let ids = text.encode(sample, false).unwrap();
    assert_eq!(ids.len(), sample.len(), "one token per byte");
    let mut detok = Detokenizer::default();
    let mut pieces = Vec::new();
    for &id in &ids {
        pieces.push(detok.push(&text, id).unwrap());
    }
    pieces.push(detok.flush(&text).unwrap());
    assert_eq!(pieces.concat(), sample);
    // Nothing but whole characters ever comes out: the 4-byte crab is held back for three
    // tokens and released with the fourth.
    let crab = sample.find('🦀').unwrap();
    assert_eq!(pieces[crab..crab + 4], ["", "", "", "🦀"]);
    // A sequence cut off by the end of output is flushed as the tokenizer decodes it.
    let mut detok = Detokenizer::default();
    assert_eq!(detok.push(&text, ids[crab]).unwrap(), "");
    assert_eq!(
        detok.flush(&text).unwrap(),
        text.decode(&ids[crab..crab + 1]).unwrap()
    );
}

/// One rule for the context and the tokens to generate, whatever the front end: an exact
/// context is refused at load when 0 or past the model's 256 positions; a launcher's is
/// capped there; `max_tokens` defaults to 256 or what the context leaves, and a request
/// that does not fit is refused with both numbers.
#[test]
fn the_context_and_max_tokens_follow_one_rule() {
    let load = |ctx_len| {
        let mut c = config("tiny-qwen3");
        c.ctx_len = ctx_len;
        Engine::load(&c).map_err(|e| e.to_string())
    };
    assert_eq!(
        load(ContextLen::Exactly(0)).err().unwrap(),
        "--ctx-len must be at least 1"
    );
    assert_eq!(
        load(ContextLen::Exactly(300)).err().unwrap(),
        "--ctx-len 300 exceeds the model's max_position_embeddings 256"
    );
    assert_eq!(load(ContextLen::AtMost(300)).unwrap().ctx_len(), Some(256));
    let unchecked = load(ContextLen::Unchecked).unwrap();
    assert_eq!(unchecked.ctx_len(), None);
    assert_eq!(unchecked.max_tokens(None, 10_000).unwrap(), 256);
    assert_eq!(unchecked.max_tokens(Some(9), 10_000).unwrap(), 9);
    let engine = load(ContextLen::Exactly(100)).unwrap();
    assert_eq!(engine.ctx_len(), Some(100));
    assert_eq!(engine.context_note(), None);
    assert_eq!(engine.max_tokens(None, 10).unwrap(), 90);
    assert_eq!(engine.max_tokens(Some(90), 10).unwrap(), 90);
    assert_eq!(
        engine.max_tokens(Some(91), 10).unwrap_err().to_string(),
        "the prompt (10 tokens) plus max_tokens (91) exceeds the context size (100 tokens)"
    );
    assert_eq!(
        engine
            .max_tokens(Some(usize::MAX), 10)
            .unwrap_err()
            .to_string(),
        format!(
            "the prompt (10 tokens) plus max_tokens ({}) exceeds the context size (100 tokens)",
            usize::MAX
        )
    );
    assert_eq!(
        engine.max_tokens(None, 100).unwrap_err().to_string(),
        "the prompt (100 tokens) leaves no room to generate in the context size (100 tokens)"
    );
    let roomy = load(ContextLen::Exactly(256)).unwrap();
    assert_eq!(roomy.max_tokens(None, 0).unwrap(), 256);
    assert_eq!(roomy.max_tokens(None, 1).unwrap(), 255);
}
