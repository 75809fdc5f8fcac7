"""onebit serve as the official Python clients see it.

Run by crates/onebit/tests/serve_clients.rs with the venv of `cargo xtask client-env`
(openai 1.x and ollama 0.6.3, pinned in clients-requirements.txt) against a live
`onebit serve` on SmolLM2 started with --api-key:

    python clients_check.py EXPECT.json

EXPECT.json holds the server's `base` URL, the `model` name, the `api_key`, and the
reference for the echoed log-probabilities: a window of token ids, the index of the first
token `onebit perplexity` scored, its per-token log-probabilities and the tolerance.

Prints `ok NAME` for each check that passed and `FAIL NAME: why` for each that did not;
exits 1 if any failed. Every check runs even after a failure.
"""

import json
import math
import sys
import traceback
import urllib.error
import urllib.request

import ollama
import openai

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


class Ctx:
    def __init__(self, expect):
        self.e = expect
        self.base = expect["base"]
        self.model = expect["model"]
        self.key = expect["api_key"]
        # No retries: a 5xx must fail here, not be retried away.
        self.oa = openai.OpenAI(base_url=self.base + "/v1", api_key=self.key, max_retries=0, timeout=300)
        self.ol = ollama.Client(host=self.base, headers={"Authorization": "Bearer " + self.key}, timeout=300)


def ask(c, content, **kw):
    kw.setdefault("max_tokens", 24)
    return c.oa.chat.completions.create(model=c.model, messages=[{"role": "user", "content": content}], **kw)


def expect_eq(a, b, what):
    if a != b:
        raise AssertionError(f"{what}: {a!r} != {b!r}")


def expect(cond, what):
    if not cond:
        raise AssertionError(what)


@check
def unauthorized_without_the_key(c):
    # OpenAI SDK with a wrong key, and the Ollama client with none: 401 in each API's shape.
    wrong = openai.OpenAI(base_url=c.base + "/v1", api_key="not-the-key", max_retries=0)
    try:
        wrong.models.list()
        raise AssertionError("models.list with a wrong key succeeded")
    except openai.AuthenticationError as e:
        expect_eq(e.status_code, 401, "status")
        expect_eq(e.body.get("code") if isinstance(e.body, dict) else None, "invalid_api_key", "error code")
    try:
        ollama.Client(host=c.base).list()
        raise AssertionError("ollama list without a key succeeded")
    except ollama.ResponseError as e:
        expect_eq(e.status_code, 401, "ollama status")
    for path in ["/v1/models", "/api/tags", "/metrics"]:
        try:
            urllib.request.urlopen(c.base + path, timeout=60)
            raise AssertionError(f"GET {path} without a key succeeded")
        except urllib.error.HTTPError as e:
            expect_eq(e.code, 401, f"GET {path} status")
    # /health stays open (launchers probe it).
    expect_eq(urllib.request.urlopen(c.base + "/health", timeout=60).status, 200, "/health")


@check
def authorized_with_the_key(c):
    req = urllib.request.Request(c.base + "/v1/models", headers={"Authorization": "Bearer " + c.key})
    expect_eq(urllib.request.urlopen(req, timeout=60).status, 200, "GET /v1/models with the key")


@check
def models_list_and_retrieve(c):
    ids = [m.id for m in c.oa.models.list().data]
    expect_eq(ids, [c.model], "models.list")
    m = c.oa.models.retrieve(c.model)
    expect_eq((m.id, m.object), (c.model, "model"), "models.retrieve")
    m = c.oa.models.retrieve(c.model + ":latest")
    expect_eq(m.id, c.model, "models.retrieve NAME:latest")
    try:
        c.oa.models.retrieve("no-such-model")
        raise AssertionError("retrieve of an unknown model succeeded")
    except openai.NotFoundError:
        pass


@check
def chat_and_stream_with_usage(c):
    r = ask(c, "What is the capital of France?", temperature=0)
    text = r.choices[0].message.content
    expect(isinstance(text, str) and text.strip(), f"empty answer: {r}")
    expect(r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, f"usage {r.usage}")
    expect_eq(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens, "total_tokens")
    parts, usage, finish = [], None, None
    stream = ask(c, "What is the capital of France?", temperature=0, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
            expect_eq(chunk.choices, [], "the usage chunk's choices")
        for ch in chunk.choices:
            parts.append(ch.delta.content or "")
            finish = ch.finish_reason or finish
    expect_eq("".join(parts), text, "streamed text vs whole text (temperature 0)")
    expect(usage is not None, "no usage chunk")
    expect_eq((usage.prompt_tokens, usage.completion_tokens), (r.usage.prompt_tokens, r.usage.completion_tokens), "streamed usage")
    expect_eq(finish, r.choices[0].finish_reason, "finish_reason")
    # The same model as NAME:latest.
    r2 = c.oa.chat.completions.create(model=c.model + ":latest", messages=[{"role": "user", "content": "What is the capital of France?"}], temperature=0, max_tokens=24)
    expect_eq(r2.choices[0].message.content, text, "NAME:latest answer")


POEM = "Write a short poem about the sea."


@check
def regenerate_without_a_seed_differs(c):
    # Open WebUI's Regenerate: the same request, temperature 0.9, no seed.
    answers = [ask(c, POEM, temperature=0.9, max_tokens=32) for _ in range(4)]
    texts = {a.choices[0].message.content for a in answers}
    seeds = {a.model_extra.get("seed") for a in answers}
    expect(len(texts) >= 2, f"4 unseeded answers at temperature 0.9 are all {texts!r}")
    expect_eq(len(seeds), 4, f"reported seeds {seeds}")
    # The reported seed replays its answer.
    a = answers[0]
    again = ask(c, POEM, temperature=0.9, max_tokens=32, seed=a.model_extra["seed"])
    expect_eq(again.choices[0].message.content, a.choices[0].message.content, "replay with the reported seed")


@check
def seeded_replays_are_equal(c):
    a = ask(c, POEM, temperature=0.9, max_tokens=32, seed=1234)
    b = ask(c, POEM, temperature=0.9, max_tokens=32, seed=1234)
    expect_eq(a.choices[0].message.content, b.choices[0].message.content, "seed 1234 twice")
    expect_eq(a.model_extra.get("seed"), 1234, "reported seed")
    # Ollama's options.seed the same way.
    o = [c.ol.generate(model=c.model, prompt=POEM, options={"temperature": 0.9, "seed": 7, "num_predict": 32}) for _ in range(2)]
    expect_eq(o[0].response, o[1].response, "ollama seed 7 twice")


@check
def chat_logprobs_shapes(c):
    r = ask(c, "Name three colours.", temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    expect_eq(len(content), r.usage.completion_tokens, "one entry per generated token")
    joined = b"".join(bytes(e.bytes) for e in content)
    expect(joined.decode("utf-8", "replace").startswith(r.choices[0].message.content), f"the entries' bytes {joined!r} do not spell the text")
    for e in content:
        expect(e.logprob <= 0 and math.isfinite(e.logprob), f"logprob {e.logprob}")
        expect_eq(len(e.top_logprobs), 3, "top_logprobs")
        tops = [t.logprob for t in e.top_logprobs]
        expect(tops == sorted(tops, reverse=True), f"alternatives not most likely first: {tops}")
        # Greedy: the chosen token is the most likely one.
        expect_eq(e.logprob, tops[0], f"greedy token {e.token!r} is not the top alternative")
        expect_eq(e.token, e.top_logprobs[0].token, "greedy token")
    expect(sum(math.exp(t) for t in tops) <= 1.0 + 1e-5, "probabilities above 1")
    # Streamed: the chunks' entries, joined, are the whole answer's.
    streamed = []
    for chunk in ask(c, "Name three colours.", temperature=0, logprobs=True, top_logprobs=3, stream=True):
        for ch in chunk.choices:
            if ch.logprobs is not None and ch.logprobs.content:
                streamed.extend(ch.logprobs.content)
    expect_eq([(e.token, e.logprob) for e in streamed], [(e.token, e.logprob) for e in content], "streamed logprobs")
    # Ollama's logprobs: the same values for the same greedy answer.
    o = c.ol.chat(model=c.model, messages=[{"role": "user", "content": "Name three colours."}], options={"temperature": 0, "num_predict": 24}, logprobs=True, top_logprobs=3)
    expect_eq(o.message.content, r.choices[0].message.content, "ollama greedy text")
    expect_eq([(e.token, e.logprob) for e in o.logprobs], [(e.token, e.logprob) for e in content], "ollama logprobs")


@check
def echo_logprobs_equal_perplexity(c):
    ids, first, ref, tol = c.e["window"], c.e["first_scored"], c.e["token_logprobs"], c.e["tolerance"]
    # lm-evaluation-harness's local-completions loglikelihood request.
    r = c.oa.completions.create(model=c.model, prompt=[ids], echo=True, logprobs=1, max_tokens=0, temperature=0)
    lp = r.choices[0].logprobs
    expect_eq(len(lp.tokens), len(ids), "echoed tokens")
    expect_eq(len(lp.token_logprobs), len(ids), "token_logprobs")
    expect(lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, "the first prompt token's values are not null")
    expect_eq(len(lp.text_offset), len(ids), "text_offset")
    served = lp.token_logprobs[first:]
    expect_eq(len(served), len(ref), "scored tokens")
    worst = max(abs(s - x) for s, x in zip(served, ref))
    print(f"  echo logprobs vs onebit perplexity: {len(ref)} tokens, max |difference| {worst:.3g} (tolerance {tol})")
    expect(worst <= tol, f"served log-probabilities differ from onebit perplexity's by {worst}")
    # max_tokens 1: the prompt's values, then the generated token's.
    r1 = c.oa.completions.create(model=c.model, prompt=[ids], echo=True, logprobs=1, max_tokens=1, temperature=0)
    l1 = r1.choices[0].logprobs
    n = r1.usage.completion_tokens
    expect(n == 1 or r1.choices[0].finish_reason == "stop", f"max_tokens 1 gave {n} tokens")
    expect_eq(len(l1.token_logprobs), len(ids) + n, "max_tokens 1")
    expect_eq(l1.token_logprobs[: len(ids)], lp.token_logprobs, "prompt values with max_tokens 1")


def cached(c, content):
    r = ask(c, content, temperature=0, max_tokens=4)
    return r.usage.prompt_tokens_details.cached_tokens


@check
def ollama_list_show_chat_latest(c):
    names = [m.model for m in c.ol.list().models]
    expect_eq(names, [c.model], "ollama list")
    s = c.ol.show(c.model + ":latest")
    expect(s.modelinfo and s.details.format == "q4nx", f"show: {s.details}")
    ref = ask(c, "What is the capital of France?", temperature=0)
    r = c.ol.chat(model=c.model + ":latest", messages=[{"role": "user", "content": "What is the capital of France?"}], options={"temperature": 0, "num_predict": 24})
    expect_eq(r.message.content, ref.choices[0].message.content, "ollama chat vs openai chat (greedy)")
    expect(r.done and r.eval_count == ref.usage.completion_tokens, f"ollama final object {r}")
    parts = [p.message.content for p in c.ol.chat(model=c.model, messages=[{"role": "user", "content": "What is the capital of France?"}], options={"temperature": 0, "num_predict": 24}, stream=True)]
    expect_eq("".join(parts), r.message.content, "ollama streamed chat")


@check
def ollama_preload_and_unload(c):
    r = c.ol.generate(model=c.model)
    expect_eq((r.done, r.done_reason, r.response), (True, "load", ""), "preload")
    r = c.ol.chat(model=c.model + ":latest")
    expect_eq((r.done, r.done_reason), (True, "load"), "preload on /api/chat")
    # A prompt asked twice is cached the second time; after the unload it is not.
    prompt = "Tell me one fact about owls."
    cached(c, prompt)
    expect(cached(c, prompt) > 0, "a repeated prompt is not cached")
    r = c.ol.generate(model=c.model + ":latest", keep_alive=0)
    expect_eq((r.done, r.done_reason), (True, "unload"), "unload")
    expect_eq(cached(c, prompt), 0, "cached tokens after keep_alive 0")


def main():
    with open(sys.argv[1]) as f:
        c = Ctx(json.load(f))
    failed = 0
    for fn in CHECKS:
        try:
            fn(c)
            print(f"ok {fn.__name__}", flush=True)
        except Exception as e:  # every check runs; each failure is named
            failed += 1
            print(f"FAIL {fn.__name__}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=3)
    print(f"{len(CHECKS) - failed} of {len(CHECKS)} checks passed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
