#!/usr/bin/env node
// ort_run.mjs - run an ONNX model with ONNX Runtime (CPU) on .npy inputs and write its outputs as .npy.
//
// Usage:
//   node bench/ort_run.mjs MODEL.onnx --input NAME=in.npy [--input NAME=in.npy ...] --output-dir DIR
//        [--threads N] [--opt-level disabled|basic|extended|all] [--iterations N [--warmup N]]
//        [--profile PREFIX] [--concurrent N] [--config KEY=VALUE ...]
//
// Every graph output is written as DIR/<output name>.npy (characters outside [A-Za-z0-9._-] in the name
// become '_'). Inputs: little-endian .npy, C order, dtypes float32, float64, int64, int32, int8, uint8, bool.
// --threads sets intraOpNumThreads (default: ONNX Runtime's choice); graph optimization defaults to 'all'.
// --iterations N times N runs after --warmup runs (default 1) and prints the latencies as one JSON line.
// --concurrent N with --iterations M: throughput, as many requests at once as N: N sessions (one per worker
// thread: onnxruntime-node runs a session's `run` on the JavaScript thread, so concurrency needs threads of
// their own), each with --threads intra-op threads, taking the M requests from one shared counter after
// --warmup runs each; prints requests/s and the latency percentiles as one JSON line (bench/throughput.py).
// --profile PREFIX: ONNX Runtime's own profiler (a Chrome trace, PREFIX_<date>.json, its path on stderr): the
// time per node and kernel, to set beside `ondine bench --profile` (bench/ort_profile.py sums it per op).
// --config KEY=VALUE: a session config entry (e.g. session.qdq_matmulnbits_accuracy_level=0), repeatable.
// Setup (once): cd bench && npm ci --onnxruntime-node-install=skip
// Errors go to stderr and the exit status is non-zero.

import fs from 'node:fs';
import path from 'node:path';
import process from 'node:process';
import {Worker, isMainThread, parentPort, workerData} from 'node:worker_threads';

const USAGE = 'usage: node bench/ort_run.mjs MODEL.onnx --input NAME=in.npy [...] --output-dir DIR ' +
    '[--threads N] [--opt-level disabled|basic|extended|all] [--iterations N [--warmup N]] [--profile PREFIX] ' +
    '[--concurrent N] [--config KEY=VALUE ...]';

class UsageError extends Error {}

// .npy descr (without byte-order character) <-> ONNX Runtime tensor type and typed array.
const NPY_TYPES = {
  f4: {ort: 'float32', array: Float32Array},
  f8: {ort: 'float64', array: Float64Array},
  i8: {ort: 'int64', array: BigInt64Array},
  i4: {ort: 'int32', array: Int32Array},
  i1: {ort: 'int8', array: Int8Array},
  u1: {ort: 'uint8', array: Uint8Array},
  b1: {ort: 'bool', array: Uint8Array},
};
const ORT_TO_DESCR = {
  float32: '<f4', float64: '<f8', int64: '<i8', int32: '<i4', int8: '|i1', uint8: '|u1', bool: '|b1',
  uint16: '<u2', int16: '<i2', uint32: '<u4', uint64: '<u8', float16: '<f2',
};

function parseArgs(argv) {
  const opts = {model: null, inputs: [], outputDir: null, threads: 0, optLevel: 'all', iterations: 0, warmup: 1,
                profile: null, concurrent: 0, config: {}};
  const value = (i, flag) => {
    if (i + 1 >= argv.length) throw new UsageError(`${flag} needs a value`);
    return argv[i + 1];
  };
  const positiveInt = (text, flag) => {
    if (!/^\d+$/.test(text)) throw new UsageError(`${flag} expects a non-negative integer, got '${text}'`);
    return Number(text);
  };
  for (let i = 0; i < argv.length; ++i) {
    const arg = argv[i];
    if (arg === '--input') {
      const spec = value(i++, arg);
      const eq = spec.indexOf('=');
      if (eq <= 0) throw new UsageError(`--input expects NAME=file.npy, got '${spec}'`);
      opts.inputs.push({name: spec.slice(0, eq), file: spec.slice(eq + 1)});
    } else if (arg === '--config') {
      const spec = value(i++, arg);
      const eq = spec.indexOf('=');
      if (eq <= 0) throw new UsageError(`--config expects KEY=VALUE, got '${spec}'`);
      // Nested as the extra session options are: "session.x=1" -> {session: {x: "1"}}.
      const keys = spec.slice(0, eq).split('.');
      let node = opts.config;
      for (const k of keys.slice(0, -1)) node = (node[k] ??= {});
      node[keys[keys.length - 1]] = spec.slice(eq + 1);
    } else if (arg === '--output-dir') {
      opts.outputDir = value(i++, arg);
    } else if (arg === '--profile') {
      opts.profile = value(i++, arg);
    } else if (arg === '--threads') {
      opts.threads = positiveInt(value(i++, arg), arg);
    } else if (arg === '--opt-level') {
      opts.optLevel = value(i++, arg);
      if (!['disabled', 'basic', 'extended', 'all'].includes(opts.optLevel))
        throw new UsageError(`--opt-level must be disabled, basic, extended or all, got '${opts.optLevel}'`);
    } else if (arg === '--iterations') {
      opts.iterations = positiveInt(value(i++, arg), arg);
    } else if (arg === '--concurrent') {
      opts.concurrent = positiveInt(value(i++, arg), arg);
    } else if (arg === '--warmup') {
      opts.warmup = positiveInt(value(i++, arg), arg);
    } else if (arg === '-h' || arg === '--help') {
      console.log(USAGE);
      process.exit(0);
    } else if (arg.startsWith('-')) {
      throw new UsageError(`unknown option '${arg}'`);
    } else if (opts.model === null) {
      opts.model = arg;
    } else {
      throw new UsageError(`unexpected argument '${arg}'`);
    }
  }
  if (opts.model === null) throw new UsageError('missing MODEL.onnx');
  if (opts.outputDir === null && opts.iterations === 0) throw new UsageError('missing --output-dir');
  if (opts.concurrent > 0 && opts.iterations === 0) throw new UsageError('--concurrent needs --iterations (the requests)');
  return opts;
}

// Reads a .npy file (format 1.0, 2.0 or 3.0) into {type, dims, data}.
function readNpy(file) {
  const bytes = fs.readFileSync(file);
  const fail = (why) => { throw new Error(`${file}: ${why}`); };
  if (bytes.length < 10 || bytes.readUInt8(0) !== 0x93 || bytes.toString('latin1', 1, 6) !== 'NUMPY')
    fail('not a .npy file');
  const major = bytes.readUInt8(6);
  if (major < 1 || major > 3) fail(`unsupported .npy format version ${major}`);
  const headerStart = major === 1 ? 10 : 12;
  if (bytes.length < headerStart) fail('truncated .npy header');
  const headerLength = major === 1 ? bytes.readUInt16LE(8) : bytes.readUInt32LE(8);
  const dataStart = headerStart + headerLength;
  if (bytes.length < dataStart) fail('truncated .npy header');
  const header = bytes.toString(major === 3 ? 'utf8' : 'latin1', headerStart, dataStart);

  const descr = /'descr'\s*:\s*'([^']*)'/.exec(header);
  const fortran = /'fortran_order'\s*:\s*(True|False)/.exec(header);
  const shape = /'shape'\s*:\s*\(([^)]*)\)/.exec(header);
  if (!descr || !fortran || !shape) fail(`malformed .npy header: ${header.trim()}`);
  if (fortran[1] === 'True') fail('Fortran-order arrays are not supported; save with np.ascontiguousarray');
  const order = descr[1][0];
  const kind = NPY_TYPES[descr[1].slice(1)];
  if (!kind || descr[1].length !== 3 || order === '>' || (order === '|' && !descr[1].endsWith('1')))
    fail(`unsupported dtype '${descr[1]}' (little-endian float32, float64, int64, int32, int8, uint8, bool)`);
  const dims = shape[1].split(',').map((s) => s.trim()).filter((s) => s.length > 0).map((s) => {
    if (!/^\d+L?$/.test(s)) fail(`malformed shape in header: (${shape[1]})`);
    return Number.parseInt(s, 10);
  });
  const count = dims.reduce((a, b) => a * b, 1);
  const byteLength = count * kind.array.BYTES_PER_ELEMENT;
  if (bytes.length - dataStart !== byteLength)
    fail(`expected ${byteLength} data bytes for shape (${dims}) ${descr[1]}, found ${bytes.length - dataStart}`);
  // Copy into a fresh ArrayBuffer: the payload offset need not be aligned for the typed array.
  const buffer = bytes.buffer.slice(bytes.byteOffset + dataStart, bytes.byteOffset + dataStart + byteLength);
  let data = new kind.array(buffer);
  if (kind.ort === 'bool') data = Uint8Array.from(data, (v) => (v ? 1 : 0));
  return {type: kind.ort, dims, data};
}

// Writes a typed array as .npy format 1.0 (header padded to a multiple of 64 bytes, as NumPy does).
function writeNpy(file, type, dims, data) {
  const descr = ORT_TO_DESCR[type];
  if (!descr) throw new Error(`output type '${type}' cannot be written as .npy`);
  const shape = dims.length === 1 ? `(${dims[0]},)` : `(${dims.join(', ')})`;
  let header = `{'descr': '${descr}', 'fortran_order': False, 'shape': ${shape}, }`;
  header += ' '.repeat(63 - ((10 + header.length) % 64)) + '\n';
  const prefix = Buffer.alloc(10);
  prefix.writeUInt8(0x93, 0);
  prefix.write('NUMPY', 1, 'latin1');
  prefix.writeUInt8(1, 6);
  prefix.writeUInt8(0, 7);
  prefix.writeUInt16LE(header.length, 8);
  const payload = Buffer.from(data.buffer, data.byteOffset, data.byteLength);
  fs.writeFileSync(file, Buffer.concat([prefix, Buffer.from(header, 'latin1'), payload]));
}

function safeFileName(name) {
  return name.replace(/[^A-Za-z0-9._-]/g, '_');
}

// The session and its feeds, as the options say.
async function openSession(opts) {
  let ort;
  try {
    ort = await import('onnxruntime-node');
  } catch (e) {
    throw new Error(`cannot load onnxruntime-node (${e.message}); ` +
                    'run: cd bench && npm ci --onnxruntime-node-install=skip');
  }

  const sessionOptions = {graphOptimizationLevel: opts.optLevel, executionMode: 'sequential'};
  if (opts.threads > 0) sessionOptions.intraOpNumThreads = opts.threads;
  if (opts.profile !== null) Object.assign(sessionOptions, {enableProfiling: true, profileFilePrefix: opts.profile});
  if (Object.keys(opts.config).length > 0) sessionOptions.extra = opts.config;
  const session = await ort.InferenceSession.create(opts.model, sessionOptions);

  const feeds = {};
  for (const {name, file} of opts.inputs) {
    if (!session.inputNames.includes(name))
      throw new Error(`model has no input '${name}' (inputs: ${session.inputNames.join(', ')})`);
    if (name in feeds) throw new Error(`input '${name}' given twice`);
    const {type, dims, data} = readNpy(file);
    feeds[name] = new ort.Tensor(type, data, dims);
  }
  const missing = session.inputNames.filter((name) => !(name in feeds));
  if (missing.length) throw new Error(`missing --input for model input(s): ${missing.join(', ')}`);
  return {session, feeds};
}

const quantile = (sorted, q) => sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];

// --concurrent: a worker thread's part (its own session; requests from the shared counter once told to go).
async function concurrentWorker() {
  const {opts, counter} = workerData;
  const {session, feeds} = await openSession(opts);
  for (let i = 0; i < opts.warmup; ++i) await session.run(feeds);
  parentPort.postMessage({ready: true});
  await new Promise((resolve) => parentPort.once('message', resolve));
  const times = [];
  while (Atomics.add(counter, 0, 1) < opts.iterations) {
    const start = process.hrtime.bigint();
    await session.run(feeds);
    times.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  parentPort.postMessage({times});
}

async function concurrent(opts) {
  const counter = new Int32Array(new SharedArrayBuffer(4));
  const workers = [];
  for (let w = 0; w < opts.concurrent; ++w)
    workers.push(new Worker(new URL(import.meta.url), {workerData: {opts, counter}}));
  const message = (worker) => new Promise((resolve, reject) => {
    worker.once('message', resolve);
    worker.once('error', reject);
  });
  await Promise.all(workers.map(message));  // every session made and warmed up
  const done = workers.map(message);
  const start = process.hrtime.bigint();
  for (const worker of workers) worker.postMessage('go');
  const times = (await Promise.all(done)).flatMap((m) => m.times);
  const wallMs = Number(process.hrtime.bigint() - start) / 1e6;
  const sorted = [...times].sort((a, b) => a - b);
  console.log(JSON.stringify({
    model: opts.model, threads: opts.threads || 'default', concurrent: opts.concurrent, requests: times.length,
    wall_ms: wallMs, requests_per_s: times.length * 1000 / wallMs, p50_ms: quantile(sorted, 0.5),
    p90_ms: quantile(sorted, 0.9), p99_ms: quantile(sorted, 0.99),
  }));
}

async function main() {
  const opts = parseArgs(process.argv.slice(2));
  if (!fs.existsSync(opts.model)) throw new Error(`${opts.model}: no such file`);
  if (opts.concurrent > 0) return concurrent(opts);
  const {session, feeds} = await openSession(opts);

  let results;
  if (opts.iterations > 0) {
    for (let i = 0; i < opts.warmup; ++i) results = await session.run(feeds);
    const times = [];
    for (let i = 0; i < opts.iterations; ++i) {
      const start = process.hrtime.bigint();
      results = await session.run(feeds);
      times.push(Number(process.hrtime.bigint() - start) / 1e6);
    }
    const sorted = [...times].sort((a, b) => a - b);
    console.log(JSON.stringify({
      model: opts.model, threads: opts.threads || 'default', iterations: opts.iterations,
      median_ms: sorted[Math.floor(sorted.length / 2)], min_ms: sorted[0],
      mean_ms: times.reduce((a, b) => a + b, 0) / times.length, times_ms: times,
    }));
  } else {
    results = await session.run(feeds);
  }

  if (opts.profile !== null) {
    await session.endProfiling();  // writes PREFIX_<date>.json (onnxruntime-node returns no path)
    console.error(`ort_run: profile written as ${opts.profile}_<date>.json`);
  }

  if (opts.outputDir !== null) {
    fs.mkdirSync(opts.outputDir, {recursive: true});
    for (const name of session.outputNames) {
      const tensor = results[name];
      writeNpy(path.join(opts.outputDir, `${safeFileName(name)}.npy`), tensor.type, tensor.dims, tensor.data);
    }
  }
}

(isMainThread ? main() : concurrentWorker()).catch((e) => {
  if (e instanceof UsageError) console.error(`ort_run: ${e.message}\n${USAGE}`);
  else console.error(`ort_run: ${e.message}`);
  process.exit(1);
});
