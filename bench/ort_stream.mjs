#!/usr/bin/env node
// ort_stream.mjs - ONNX Runtime (CPU) on workloads whose input shapes change from call to call: the ONNX
// Runtime side of bench/dynamic_shapes.py, which writes the spec and runs Ondine on the very same workload.
//
// Usage:
//   node bench/ort_stream.mjs --spec SPEC.json [--threads N]
//
// SPEC.json is one of
//   {"mode": "encoder", "model": "models/torch/hf_bert_pt/model.onnx", "lengths": [L_0, L_1, ...]}
//   {"mode": "decode", "model": "models/torch/gpt2_kv_pt/model.onnx", "prompt": 32, "steps": 64, "repeats": 3,
//    "report_pasts": [32, 64, 95]}
// encoder (inputs input_ids, attention_mask [1, L]): 2 warm-up requests of length 64 (not counted), then one
//   request per length, input_ids[0, j] = 1 + (r * 131 + j * 7) % 7999 for request r, the mask all ones.
//   Prints total_s (the loop's wall time), p50_ms, p99_ms, distinct_lengths and latencies_ms (each awaited
//   session.run; the inputs are made before the loop).
// decode (input_ids [1, seq], past_key_i/past_value_i or past_key_values.i.key/value [1, heads, past, dim], and
// attention_mask / position_ids where the model has them): a prompt of `prompt` tokens
//   (ids 1 + (j * 7) % 7999) with zero-length pasts, then `steps` steps of one token, each fed the previous
//   run's present_key_i/present_value_i as they came out (the ORT tensors themselves, no copies), the next token
//   the argmax of the last logits row. Repeated `repeats` times, no warm-up; per repeat: prompt_ms, token_ms
//   (each step's session.run), p50/p90 of those, the step at each past length of report_pasts (default: prompt,
//   2 * prompt and prompt + steps - 1 where they are among the steps), and the tokens fed to the steps; then the
//   median of every number over the repeats.
// Session options: intraOpNumThreads = --threads (default 2), interOpNumThreads 1, graph optimization 'all',
// sequential execution; the spec's "session_config" (nested keys, e.g. {"session": {"qdq_matmulnbits_accuracy_level":
// "4"}}) goes to the session's config entries. Prints one JSON line; errors go to stderr and the exit status is non-zero.
// Setup (once): cd bench && npm ci --onnxruntime-node-install=skip

import fs from 'node:fs';
import path from 'node:path';
import process from 'node:process';
import {fileURLToPath} from 'node:url';

const USAGE = 'usage: node bench/ort_stream.mjs --spec SPEC.json [--threads N]';

class UsageError extends Error {}

function parseArgs(argv) {
  const opts = {spec: null, threads: 2};
  for (let i = 0; i < argv.length; ++i) {
    const arg = argv[i];
    const value = () => {
      if (i + 1 >= argv.length) throw new UsageError(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg === '--spec') {
      opts.spec = value();
    } else if (arg === '--threads') {
      const text = value();
      if (!/^\d+$/.test(text) || Number(text) < 1) throw new UsageError(`--threads expects a positive integer, got '${text}'`);
      opts.threads = Number(text);
    } else if (arg === '-h' || arg === '--help') {
      console.log(USAGE);
      process.exit(0);
    } else {
      throw new UsageError(`unexpected argument '${arg}'`);
    }
  }
  if (opts.spec === null) throw new UsageError('missing --spec');
  return opts;
}

// numpy.percentile's default (linear interpolation between the closest ranks).
function percentile(values, q) {
  const s = [...values].sort((a, b) => a - b);
  if (s.length === 0) return null;
  const pos = (s.length - 1) * q / 100;
  const lo = Math.floor(pos);
  const hi = Math.ceil(pos);
  return s[lo] + (s[hi] - s[lo]) * (pos - lo);
}

const median = (values) => percentile(values, 50);
const nowMs = () => Number(process.hrtime.bigint()) / 1e6;

function tokenIds(length, r) {
  const ids = new BigInt64Array(length);
  for (let j = 0; j < length; ++j) ids[j] = BigInt(1 + (r * 131 + j * 7) % 7999);
  return ids;
}

async function encoder(ort, session, spec) {
  const lengths = spec.lengths;
  if (!Array.isArray(lengths) || lengths.length === 0 || !lengths.every((l) => Number.isInteger(l) && l > 0))
    throw new Error('spec: encoder needs "lengths", a list of positive integers');
  const feedsOf = (length, r) => ({
    input_ids: new ort.Tensor('int64', tokenIds(length, r), [1, length]),
    attention_mask: new ort.Tensor('int64', new BigInt64Array(length).fill(1n), [1, length]),
  });
  for (let w = 0; w < 2; ++w) await session.run(feedsOf(64, w));
  const requests = lengths.map((length, r) => feedsOf(length, r));
  const latencies = [];
  const start = nowMs();
  for (const feeds of requests) {
    const t0 = nowMs();
    await session.run(feeds);
    latencies.push(nowMs() - t0);
  }
  const total = (nowMs() - start) / 1e3;
  return {requests: lengths.length, distinct_lengths: new Set(lengths).size, total_s: total,
          p50_ms: median(latencies), p99_ms: percentile(latencies, 99), latencies_ms: latencies};
}

function argmaxLastRow(tensor) {
  const dims = tensor.dims;
  const vocab = dims[dims.length - 1];
  const data = tensor.data;
  const base = data.length - vocab;
  let best = 0;
  for (let k = 1; k < vocab; ++k) if (data[base + k] > data[base + best]) best = k;
  return best;
}

// (past, present) names: past_key_0 <- present_key_0, or past_key_values.0.key <- present.0.key (Optimum's).
function kvPairs(names) {
  const pairs = [];
  for (const name of names) {
    if (name.startsWith('past_key_values.')) pairs.push([name, 'present.' + name.slice('past_key_values.'.length)]);
    else if (name.startsWith('past_')) pairs.push([name, 'present_' + name.slice('past_'.length)]);
  }
  return pairs;
}

async function decode(ort, session, spec) {
  const prompt = spec.prompt ?? 32;
  const steps = spec.steps ?? 64;
  const repeats = spec.repeats ?? 3;
  const pairs = kvPairs(session.inputNames);
  if (pairs.length === 0) throw new Error('the model has no past_* inputs');
  // An empty past: [1, heads, 0, head_dim] from the declared shape.
  const meta = Object.fromEntries(session.inputMetadata.map((m) => [m.name, m]));
  const emptyDims = (name) => meta[name].shape.map((d, i) => (i === 0 ? 1 : i === 2 ? 0 : d));
  const hasMask = session.inputNames.includes('attention_mask');
  const hasPositions = session.inputNames.includes('position_ids');
  const extra = (feeds, seq, past) => {
    if (hasMask) feeds.attention_mask = new ort.Tensor('int64', new BigInt64Array(past + seq).fill(1n), [1, past + seq]);
    if (hasPositions) {
      const pos = new BigInt64Array(seq);
      for (let j = 0; j < seq; ++j) pos[j] = BigInt(past + j);
      feeds.position_ids = new ort.Tensor('int64', pos, [1, seq]);
    }
  };
  const pasts = (spec.report_pasts ?? [prompt, 2 * prompt, prompt + steps - 1])
      .filter((p) => p >= prompt && p < prompt + steps);
  const runs = [];
  for (let rep = 0; rep < repeats; ++rep) {
    const ids = new BigInt64Array(prompt);
    for (let j = 0; j < prompt; ++j) ids[j] = BigInt(1 + (j * 7) % 7999);
    const feeds = {input_ids: new ort.Tensor('int64', ids, [1, prompt])};
    extra(feeds, prompt, 0);
    for (const [past] of pairs) feeds[past] = new ort.Tensor('float32', new Float32Array(0), emptyDims(past));
    let t0 = nowMs();
    let out = await session.run(feeds);
    const promptMs = nowMs() - t0;
    const tokens = [];
    const tokenMs = [];
    for (let s = 0; s < steps; ++s) {
      const token = argmaxLastRow(out.logits);
      tokens.push(token);
      feeds.input_ids = new ort.Tensor('int64', BigInt64Array.of(BigInt(token)), [1, 1]);
      extra(feeds, 1, prompt + s);
      for (const [past, present] of pairs) feeds[past] = out[present];
      t0 = nowMs();
      out = await session.run(feeds);
      tokenMs.push(nowMs() - t0);
    }
    const atPast = {};
    for (const p of pasts) atPast[p] = tokenMs[p - prompt];
    runs.push({prompt_ms: promptMs, p50_ms: median(tokenMs), p90_ms: percentile(tokenMs, 90), at_past_ms: atPast,
               token_ms: tokenMs, tokens});
  }
  const atPast = {};
  for (const p of pasts) atPast[p] = median(runs.map((r) => r.at_past_ms[p]));
  return {prompt, steps, repeats,
          median: {prompt_ms: median(runs.map((r) => r.prompt_ms)), p50_ms: median(runs.map((r) => r.p50_ms)),
                   p90_ms: median(runs.map((r) => r.p90_ms)), at_past_ms: atPast},
          runs};
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  const spec = JSON.parse(fs.readFileSync(opts.spec, 'utf8'));
  if (!['encoder', 'decode'].includes(spec.mode)) throw new Error(`spec: mode must be encoder or decode, got '${spec.mode}'`);
  if (!spec.model || !fs.existsSync(spec.model)) throw new Error(`spec: model '${spec.model}': no such file`);
  let ort;
  try {
    ort = await import('onnxruntime-node');
  } catch (e) {
    throw new Error(`cannot load onnxruntime-node (${e.message}); ` +
                    'run: cd bench && npm ci --onnxruntime-node-install=skip');
  }
  let version = 'unknown';
  try {
    const here = path.dirname(fileURLToPath(import.meta.url));
    version = JSON.parse(fs.readFileSync(path.join(here, 'node_modules', 'onnxruntime-node', 'package.json'))).version;
  } catch { /* the version is informative only */ }

  const t0 = nowMs();
  const session = await ort.InferenceSession.create(spec.model, {
    intraOpNumThreads: opts.threads, interOpNumThreads: 1, graphOptimizationLevel: 'all', executionMode: 'sequential',
    ...(spec.session_config ? {extra: spec.session_config} : {})});
  const loadS = (nowMs() - t0) / 1e3;
  const result = spec.mode === 'encoder' ? await encoder(ort, session, spec) : await decode(ort, session, spec);
  console.log(JSON.stringify({engine: 'onnxruntime-node', version, mode: spec.mode, model: spec.model,
                              threads: opts.threads, load_s: loadS, ...result}));
}

main().catch((e) => {
  if (e instanceof UsageError) console.error(`ort_stream: ${e.message}\n${USAGE}`);
  else console.error(`ort_stream: ${e.message}`);
  process.exit(1);
});
