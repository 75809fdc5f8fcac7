#!/usr/bin/env python3
"""Concurrent greedy streams against one over HTTP, on a running `onebit serve`.

Issue 25's serve row: N concurrent greedy completions against the same N one at a time,
total generated tokens per second, in alternating trials, and every concurrent answer
must equal its alone-served answer byte for byte. Start the server first, e.g.

    target/release/onebit serve target/models/smollm2 --parallel 4 --ctx-len 2048 --port 52700 --quiet
    python3 xtask/scripts/serve_streams.py --url http://127.0.0.1:52700 --streams 4

The standard library only (urllib and threads), so it runs on a fresh machine.
Every request sets `ignore_eos` (llama-server's extension) so each stream generates the
full budget. Exit status 1 when an answer differs from its alone-served one, a stream
generates fewer tokens than asked, or a request fails; the last line is JSON.
"""

import argparse
import json
import sys
import threading
import time
import urllib.error
import urllib.request

# Distinct openings that keep a small model writing past the token budget.
PROMPTS = [
    "Write a long story about a lighthouse keeper who finds a map in a bottle.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe a busy market in an old city, its sounds, smells and people.",
    "Tell the history of the printing press and how it changed Europe.",
    "Write a letter from a sailor to his sister about a storm at sea.",
    "Explain how bread is made, from the wheat field to the bakery.",
    "Describe a long walk through a forest in autumn, hour by hour.",
    "Tell a story about two friends who build a boat together.",
]


def complete(url, model, prompt, tokens, timeout):
    """One greedy completion: (text, completion tokens)."""
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": tokens,
            "temperature": 0,
            # llama-server's extension, which onebit serve takes: every stream
            # generates the full budget (a raw prompt may otherwise end at once).
            "ignore_eos": True,
        }
    ).encode()
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/completions",
        data=body,
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.load(resp)
    except urllib.error.HTTPError as e:
        # The server's own error text says what it refused.
        raise RuntimeError(f"HTTP {e.code}: {e.read().decode(errors='replace')}") from e
    return answer["choices"][0]["text"], answer["usage"]["completion_tokens"]


def one_at_a_time(url, model, prompts, tokens, timeout):
    start = time.perf_counter()
    results = [complete(url, model, p, tokens, timeout) for p in prompts]
    return time.perf_counter() - start, results


def concurrent(url, model, prompts, tokens, timeout):
    results = [None] * len(prompts)
    errors = []

    def run(i, prompt):
        try:
            results[i] = complete(url, model, prompt, tokens, timeout)
        except Exception as e:  # reported below, with the request it belongs to
            errors.append(f"stream {i}: {e}")

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    secs = time.perf_counter() - start
    if errors:
        raise RuntimeError("; ".join(errors))
    return secs, results


def model_name(url, timeout):
    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout) as resp:
        return json.load(resp)["data"][0]["id"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:52625")
    ap.add_argument("--streams", type=int, default=4, help="concurrent requests (1..8)")
    ap.add_argument("--tokens", type=int, default=128, help="max tokens per answer")
    ap.add_argument("--trials", type=int, default=3, help="alternating trials of each")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    args = ap.parse_args()
    if not 1 <= args.streams <= len(PROMPTS):
        sys.exit(f"serve_streams: --streams {args.streams}: 1..{len(PROMPTS)}")
    if args.trials < 1 or args.tokens < 1:
        sys.exit("serve_streams: --trials and --tokens must be at least 1")
    try:
        model = model_name(args.url, args.timeout)
    except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError) as e:
        sys.exit(f"serve_streams: cannot list the models of {args.url}: {e}")
    try:
        return measure(args, model)
    except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError, RuntimeError) as e:
        print(f"serve_streams: a request to {args.url} failed: {e}", file=sys.stderr)
        return 1


def measure(args, model):
    prompts = PROMPTS[: args.streams]
    # One warm-up answer (first-request allocations, page faults of the weights).
    one_at_a_time(args.url, model, prompts[:1], 8, args.timeout)
    alone_tps, together_tps = [], []
    reference = None
    differing = []
    for trial in range(args.trials):
        secs, alone = one_at_a_time(args.url, model, prompts, args.tokens, args.timeout)
        alone_tps.append(sum(n for _, n in alone) / secs)
        secs, together = concurrent(args.url, model, prompts, args.tokens, args.timeout)
        together_tps.append(sum(n for _, n in together) / secs)
        if reference is None:
            reference = alone
        for i, (a, t) in enumerate(zip(alone, together)):
            if a[0] != t[0] or a[0] != reference[i][0]:
                differing.append(f"trial {trial} stream {i}")
        print(
            f"trial {trial + 1}: {args.streams} one at a time {alone_tps[-1]:.1f} tok/s, "
            f"concurrent {together_tps[-1]:.1f} tok/s ({together_tps[-1] / alone_tps[-1]:.2f}x)",
            flush=True,
        )
    short = [i for i, (_, n) in enumerate(reference) if n != args.tokens]
    if short:
        print(f"serve_streams: streams {short} generated fewer than {args.tokens} tokens")
    summary = {
        "streams": args.streams,
        "tokens": args.tokens,
        "model": model,
        "alone_tok_s": [round(v, 1) for v in alone_tps],
        "concurrent_tok_s": [round(v, 1) for v in together_tps],
        "ratios": [round(t / a, 3) for a, t in zip(alone_tps, together_tps)],
        "completion_tokens": [n for _, n in reference],
        "answers_equal": not differing,
        "full_length": not short,
    }
    if differing:
        print("serve_streams: answers differ from the alone-served ones: " + ", ".join(differing))
    print(json.dumps(summary))
    return 1 if differing or short else 0


if __name__ == "__main__":
    sys.exit(main())
