#!/usr/bin/env node
// `npm run lint` and `npm run format`: ESLint, Prettier and clang-format over the files git tracks,
// so that build output and files nobody committed are never checked. The file lists live here only.
//
//   node scripts/lint.mjs [pathspec...]           ESLint, `prettier --check`, `clang-format --dry-run --Werror`;
//                                                 exits 1 when any of them finds a problem (all three always run)
//   node scripts/lint.mjs --format [pathspec...]  `prettier --write` and `clang-format -i`
//   node scripts/lint.mjs --fix [pathspec...]     `eslint --fix`, then the two formatters write
//
// Pathspecs (as git takes them) narrow the run: `npm run lint -- bench scripts lib/device.ts`.
// clang-format must be version 14 (Debian bookworm's, which scripts/setup installs): other versions
// lay out some constructs differently. CLANG_FORMAT names another binary.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = dirname(dirname(fileURLToPath(import.meta.url)));
const CLANG_FORMAT_MAJOR = 14;

/** Files ESLint checks (with the types of tsconfig.json for TypeScript) and Prettier formats. */
const SCRIPT_FILES = ['*.ts', '*.mts', '*.cts', '*.js', '*.mjs', '*.cjs'];
/** Files only Prettier formats; npm writes package-lock.json itself. */
const DATA_FILES = ['*.json', ':(exclude)package-lock.json'];
/** C++ and CUDA sources and headers anywhere in the tree (native/, the CUDA emulator), for clang-format. */
const NATIVE_FILES = ['*.cc', '*.cpp', '*.h', '*.hpp', '*.cu', '*.cuh'];

const args = process.argv.slice(2);
const mode = args.includes('--fix') ? 'fix' : args.includes('--format') ? 'format' : 'check';
const pathspecs = args.filter((a) => a !== '--fix' && a !== '--format');

function fail(message) {
  console.error(`lint: ${message}`);
  process.exit(2);
}

/** Tracked files that match one of `patterns` and one of the pathspecs given on the command line. */
function tracked(patterns) {
  const r = spawnSync('git', ['ls-files', '-z', '--', ...patterns], { cwd: root, encoding: 'utf8' });
  if (r.error || r.status !== 0) fail(`git ls-files failed: ${r.error?.message ?? r.stderr.trim()}`);
  let files = r.stdout.split('\0').filter(Boolean);
  if (pathspecs.length > 0) {
    const narrowed = spawnSync('git', ['ls-files', '-z', '--', ...pathspecs], { cwd: root, encoding: 'utf8' });
    if (narrowed.error || narrowed.status !== 0) {
      fail(`git ls-files failed: ${narrowed.error?.message ?? narrowed.stderr.trim()}`);
    }
    const wanted = new Set(narrowed.stdout.split('\0'));
    files = files.filter((f) => wanted.has(f));
  }
  // A tracked file deleted in the work tree is not there to check.
  return files.filter((f) => existsSync(join(root, f)));
}

function bin(name) {
  const path = join(root, 'node_modules', '.bin', name);
  if (!existsSync(path)) fail(`${name} is not installed: run \`npm ci\` first`);
  return path;
}

/** The clang-format binary of the pinned major version, or a message saying how to get it. */
function clangFormat() {
  const candidates = process.env.CLANG_FORMAT
    ? [process.env.CLANG_FORMAT]
    : [`clang-format-${CLANG_FORMAT_MAJOR}`, 'clang-format'];
  for (const candidate of candidates) {
    const r = spawnSync(candidate, ['--version'], { encoding: 'utf8' });
    if (r.error || r.status !== 0) continue;
    const major = Number(/version (\d+)\./.exec(r.stdout)?.[1]);
    if (major === CLANG_FORMAT_MAJOR) return candidate;
    fail(
      `${candidate} is version ${major || 'unknown'}; the style is pinned to clang-format ${CLANG_FORMAT_MAJOR} ` +
        `(apt-get install clang-format-${CLANG_FORMAT_MAJOR}, or set CLANG_FORMAT)`,
    );
  }
  return fail(
    `clang-format ${CLANG_FORMAT_MAJOR} not found: apt-get install clang-format-${CLANG_FORMAT_MAJOR} (scripts/setup installs it)`,
  );
}

/** Runs one tool over `files`; returns whether it succeeded. Nothing to check counts as success. */
function run(label, command, toolArgs, files) {
  if (files.length === 0) return true;
  console.log(`lint: ${label} (${files.length} files)`);
  const r = spawnSync(command, [...toolArgs, ...files], { cwd: root, stdio: 'inherit' });
  if (r.error) fail(`could not run ${command}: ${r.error.message}`);
  return r.status === 0;
}

const scripts = tracked(SCRIPT_FILES);
const formatted = [...scripts, ...tracked(DATA_FILES)];
const native = tracked(NATIVE_FILES);
const clang = native.length > 0 ? clangFormat() : '';

const failed = [];
if (mode === 'check') {
  if (!run('eslint', bin('eslint'), ['--max-warnings', '0'], scripts)) failed.push('eslint');
  if (!run('prettier --check', bin('prettier'), ['--check'], formatted)) failed.push('prettier');
  // One report per file is enough to find it; `npm run format` fixes them all.
  if (!run('clang-format --dry-run', clang, ['--dry-run', '--Werror', '--ferror-limit=1'], native)) {
    failed.push('clang-format');
  }
} else {
  if (mode === 'fix' && !run('eslint --fix', bin('eslint'), ['--fix'], scripts)) failed.push('eslint');
  if (!run('prettier --write', bin('prettier'), ['--write', '--log-level', 'warn'], formatted)) failed.push('prettier');
  if (!run('clang-format -i', clang, ['-i'], native)) failed.push('clang-format');
}
if (failed.length > 0) {
  console.error(`lint: problems found by ${failed.join(', ')}`);
  process.exit(1);
}
console.log(mode === 'check' ? 'lint: clean' : 'lint: done');
