#!/usr/bin/env node
// Turns a CUDA source (.cu) into C++ that the host compiler builds against the emulated CUDA
// headers (include/):
//
//   name<targs> <<<grid, block[, shared[, stream]]>>>(args)
//       -> ::rc_emu::launch(name<targs>, "name", grid, block[, shared[, stream]])(args)
//   extern __shared__ T name[];      -> T* name = ::rc_emu::dynamicShared<T>();
//   __shared__ T name[N];            -> the same, then a call that fills it with NaN bytes once per
//                                       block (rc_emu::poisonStaticShared), on the same line
//   #pragma unroll [n]               -> commented out (the host compiler does not know it)
//
// Line numbers are kept (no newline is added or removed in the body) and the output starts with
// `#line 1 "<input>"`, so diagnostics and __builtin_FILE() point at the .cu file. Comments and
// string literals are left alone. The output is written only when its content changes, so that
// builds stay incremental.
//
// Usage: node translate.mjs <in.cu> <out.cc>

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

function fail(message) {
  process.stderr.write(`translate.mjs: ${message}\n`);
  process.exit(1);
}

// A copy of `text` in which comments, string and character literals are blanked (newlines kept),
// so that searches only see code. Offsets are the same as in `text`.
function maskCode(text) {
  const out = text.split('');
  const blank = (from, to) => {
    for (let k = from; k < to; ++k) if (out[k] !== '\n') out[k] = ' ';
  };
  let i = 0;
  const n = text.length;
  while (i < n) {
    const c = text[i];
    const next = text[i + 1];
    if (c === '/' && next === '/') {
      let j = i + 2;
      while (j < n && text[j] !== '\n') {
        if (text[j] === '\\' && text[j + 1] === '\n') j += 2;
        else ++j;
      }
      blank(i, j);
      i = j;
    } else if (c === '/' && next === '*') {
      const end = text.indexOf('*/', i + 2);
      const j = end < 0 ? n : end + 2;
      blank(i, j);
      i = j;
    } else if (c === 'R' && next === '"' && !/[A-Za-z0-9_]/.test(text[i - 1] ?? '')) {
      // Raw string literal R"delim( ... )delim".
      const open = text.indexOf('(', i + 2);
      if (open < 0) fail('unterminated raw string literal');
      const delimiter = text.slice(i + 2, open);
      const close = text.indexOf(`)${delimiter}"`, open + 1);
      const j = close < 0 ? n : close + delimiter.length + 2;
      blank(i + 1, j);
      i = j;
    } else if (c === '"' || (c === "'" && !isDigitSeparator(text, i))) {
      let j = i + 1;
      while (j < n && text[j] !== c && text[j] !== '\n') j += text[j] === '\\' ? 2 : 1;
      blank(i + 1, Math.min(j, n));
      i = j + 1;
    } else {
      ++i;
    }
  }
  return out.join('');
}

// A quote inside a number (1'000'000) separates digits.
function isDigitSeparator(text, i) {
  let j = i - 1;
  while (j >= 0 && /[A-Za-z0-9_.']/.test(text[j])) --j;
  return j + 1 < i && /[0-9]/.test(text[j + 1]);
}

function lineOf(text, offset) {
  let line = 1;
  for (let k = 0; k < offset; ++k) if (text[k] === '\n') ++line;
  return line;
}

const closers = { ')': '(', ']': '[', '}': '{' };
const openers = { '(': ')', '[': ']', '{': '}' };

// Index of the bracket matching the closer at `i`, scanning backwards.
function matchBackward(code, i) {
  const stack = [code[i]];
  for (let j = i - 1; j >= 0; --j) {
    const c = code[j];
    if (c in closers) stack.push(c);
    else if (c in openers) {
      if (openers[c] !== stack.pop()) return -1;
      if (stack.length === 0) return j;
    }
  }
  return -1;
}

// The launch at `at` (the offset of `<<<`): returns the edit, or fails with where it went wrong.
function parseLaunch(text, code, at, file) {
  const where = () => `${file}:${lineOf(text, at)}`;
  // Configuration: up to the `>>>` outside any brackets.
  let depth = 0;
  let cfgEnd = -1;
  for (let i = at + 3; i < code.length; ++i) {
    const c = code[i];
    if (c in openers) ++depth;
    else if (c in closers) --depth;
    else if (c === ';') break;
    else if (depth === 0 && code.startsWith('>>>', i)) {
      cfgEnd = i;
      break;
    }
    if (depth < 0) break;
  }
  if (cfgEnd < 0) fail(`${where()}: cannot find the '>>>' closing this kernel launch`);
  let after = cfgEnd + 3;
  while (after < code.length && /\s/.test(code[after])) ++after;
  if (code[after] !== '(') fail(`${where()}: expected '(' and the kernel arguments after '>>>'`);

  // The kernel: an identifier (maybe qualified), maybe with template arguments.
  let j = at - 1;
  while (j >= 0 && /\s/.test(code[j])) --j;
  const exprEnd = j + 1;
  if (code[j] === '>') {
    let angles = 0;
    for (; j >= 0; --j) {
      const c = code[j];
      if (c in closers) {
        j = matchBackward(code, j);
        if (j < 0) break;
      } else if (c === '>') {
        ++angles;
      } else if (c === '<') {
        if (--angles === 0) break;
      } else if (c === ';' || c === '{' || c === '}') {
        j = -1;
        break;
      }
    }
    if (j < 0) fail(`${where()}: cannot find the template arguments of the launched kernel`);
    --j;
    while (j >= 0 && /\s/.test(code[j])) --j;
  }
  const nameEnd = j + 1;
  while (j >= 0 && (/[A-Za-z0-9_]/.test(code[j]) || (code[j] === ':' && code[j - 1] === ':'))) {
    j -= code[j] === ':' ? 2 : 1;
  }
  const nameStart = j + 1;
  const name = text.slice(nameStart, nameEnd).replace(/\s+/g, '');
  const shownName = name.replace(/^::/, '');
  if (!/^(::)?[A-Za-z_]\w*(::[A-Za-z_]\w*)*$/.test(name)) {
    fail(`${where()}: cannot find the name of the launched kernel`);
  }
  const expr = text.slice(nameStart, exprEnd);
  const gap = text.slice(exprEnd, at);
  const cfg = text.slice(at + 3, cfgEnd);
  return {
    start: nameStart,
    end: cfgEnd + 3,
    text: `::rc_emu::launch(${expr}, "${shownName}",${gap === '' ? ' ' : gap}${cfg})`,
  };
}

export function translate(text, file) {
  const code = maskCode(text);
  const edits = [];

  for (let at = code.indexOf('<<<'); at >= 0; at = code.indexOf('<<<', at + 3)) {
    const edit = parseLaunch(text, code, at, file);
    edits.push(edit);
    at = edit.end - 3;
  }

  const shared = /\bextern\s+__shared__\s+([^;{}]*?)\s*\b([A-Za-z_]\w*)\s*\[\s*\]\s*;/dg;
  for (let m; (m = shared.exec(code)) !== null;) {
    const [typeStart, typeEnd] = m.indices[1];
    const type = text
      .slice(typeStart, typeEnd)
      .replace(/__align__\s*\([^)]*\)/g, '')
      .replace(/\s+/g, ' ')
      .trim();
    if (type === '') fail(`${file}:${lineOf(text, m.index)}: extern __shared__ array without a type`);
    const newlines = m[0].split('\n').length - 1;
    edits.push({
      start: m.index,
      end: m.index + m[0].length,
      text: `${type}* ${m[2]} = ::rc_emu::dynamicShared<${type}>();${'\n'.repeat(newlines)}`,
    });
  }

  // Static shared variables: poisoned at each block's start (see rc_emu::poisonStaticShared), by a
  // statement appended on the declaration's own line.
  const staticShared = /\b__shared__\s+([^;{}()]*?)\b([A-Za-z_]\w*)\s*((?:\[[^;\]]*\]\s*)*);/g;
  for (let m; (m = staticShared.exec(code)) !== null;) {
    if (/\bextern\s+$/.test(code.slice(Math.max(0, m.index - 16), m.index))) continue;
    const end = m.index + m[0].length;
    const name = m[2];
    edits.push({
      start: end,
      end,
      text: ` static thread_local uint64_t rcEmuBlock_${name} = ~uint64_t{0}; ::rc_emu::poisonStaticShared(&${name}, sizeof(${name}), rcEmuBlock_${name});`,
    });
  }

  // The host compiler does not know `#pragma unroll` (and would warn about every one).
  const unroll = /^([ \t]*)#[ \t]*pragma[ \t]+unroll\b[^\n]*$/gm;
  for (let m; (m = unroll.exec(code)) !== null;) {
    const start = m.index + m[1].length;
    const end = m.index + m[0].length;
    edits.push({ start, end, text: `// ${text.slice(start, end).trim()}` });
  }

  edits.sort((a, b) => a.start - b.start);
  let out = '';
  let cursor = 0;
  for (const edit of edits) {
    if (edit.start < cursor) fail(`${file}:${lineOf(text, edit.start)}: overlapping rewrites`);
    out += text.slice(cursor, edit.start) + edit.text;
    cursor = edit.end;
  }
  out += text.slice(cursor);

  const left = maskCode(out).indexOf('<<<');
  if (left >= 0) fail(`${file}:${lineOf(out, left)}: a '<<<' was left untranslated`);
  if (out.split('\n').length !== text.split('\n').length) fail(`${file}: the line count changed`);
  return out;
}

function main(argv) {
  if (argv.length !== 2) {
    process.stderr.write('usage: node translate.mjs <in.cu> <out.cc>\n');
    process.exit(2);
  }
  const [input, output] = argv;
  let text;
  try {
    text = fs.readFileSync(input, 'utf8');
  } catch (e) {
    fail(`cannot read ${input}: ${e.message}`);
  }
  const source = path.resolve(input);
  const body = translate(text, input);
  const result =
    `// Generated from ${source} by test/cuda-emulator/translate.mjs.\n` + `#line 1 ${JSON.stringify(source)}\n` + body;
  let existing = null;
  try {
    existing = fs.readFileSync(output, 'utf8');
  } catch {
    existing = null;
  }
  if (existing === result) return;
  fs.mkdirSync(path.dirname(path.resolve(output)), { recursive: true });
  fs.writeFileSync(output, result);
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  main(process.argv.slice(2));
}
