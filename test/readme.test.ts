// Every ```ts block of README.md type-checks against the package and runs as written. The data an
// example only names (your images, your loaders, a folder of JPEGs) is made here in a temporary
// folder, the example's working directory. The module name 'resnet-cuda' is the one edit: it
// points at test/readme/resnet-cuda.ts, the package with two documented scale-downs (no GPU needed,
// at most one epoch per fit).
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import sharp from 'sharp';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CenterCrop, Compose, DataLoader, ShapesDataset } from '../lib/index.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const shim = join(root, 'test', 'readme', 'resnet-cuda.ts');

/** The ```ts blocks of the README, with the line each starts at. */
function blocks(): { line: number; code: string }[] {
  const lines = readFileSync(join(root, 'README.md'), 'utf8').split('\n');
  const out: { line: number; code: string }[] = [];
  for (let i = 0; i < lines.length; i++) {
    if (lines[i]!.trim() !== '```ts') continue;
    const start = i + 1;
    while (++i < lines.length && lines[i]!.trim() !== '```');
    out.push({ line: start + 1, code: lines.slice(start, i).join('\n') });
  }
  return out;
}

/** What the examples use without defining it: the reader's own data. */
const PRELUDE_TYPES = `
import type { DataLoader } from 'resnet-cuda';
declare global {
  /** Your decoded images, 32 x 224 x 224 x 3 bytes. */
  var batchBytes: Uint8Array;
  /** Their labels. */
  var labels: Int32Array;
  var trainLoader: DataLoader;
  var valLoader: DataLoader;
  var testLoader: DataLoader;
}
export {};
`;

function shapesLoader(length: number, seed: number): DataLoader {
  return new DataLoader(new ShapesDataset({ length, size: 32, classes: 4, seed }), {
    batchSize: 8,
    transform: new Compose([new CenterCrop({ size: 32 })]),
    workers: 0,
    seed,
  });
}

/** A folder of JPEGs in ImageFolder's layout: `data/train/<class>/*.jpg`. */
async function writeImageFolder(base: string): Promise<void> {
  const colours = { red: { r: 220, g: 30, b: 30 }, blue: { r: 30, g: 30, b: 220 } };
  for (const [name, background] of Object.entries(colours)) {
    const folder = join(base, 'data', 'train', name);
    mkdirSync(folder, { recursive: true });
    for (let i = 0; i < 10; i++) {
      const jpeg = await sharp({ create: { width: 40 + i, height: 36, channels: 3, background } })
        .jpeg()
        .toBuffer();
      writeFileSync(join(folder, `${i}.jpg`), jpeg);
    }
  }
}

const work = mkdtempSync(join(tmpdir(), 'resnet-cuda-readme-'));
const cwd = process.cwd();
const examples = blocks();
const files = examples.map((_, i) => join(work, `example-${i}.ts`));

beforeAll(async () => {
  examples.forEach((b, i) =>
    writeFileSync(
      files[i]!,
      b.code.replace(/from 'resnet-cuda'/g, `from ${JSON.stringify(shim.replace(/\.ts$/, '.js'))}`),
    ),
  );
  await writeImageFolder(work);
  process.chdir(work);
});
afterAll(() => {
  process.chdir(cwd);
  rmSync(work, { recursive: true, force: true });
});

describe('README examples', () => {
  it('has examples', () => {
    expect(examples.length).toBeGreaterThanOrEqual(3);
  });

  it('type-check against the package (strict, unchecked index access)', () => {
    const prelude = join(work, 'prelude.d.ts');
    writeFileSync(prelude, PRELUDE_TYPES);
    // As in an ES-module project, where the examples' top-level await is allowed.
    writeFileSync(join(work, 'package.json'), '{ "type": "module" }\n');
    const program = ts.createProgram(
      [prelude, ...examples.map((b, i) => join(work, `typed-${i}.ts`))].map((f, i) => {
        if (i > 0) writeFileSync(f, `export {};\n${examples[i - 1]!.code}`);
        return f;
      }),
      {
        strict: true,
        noUncheckedIndexedAccess: true,
        target: ts.ScriptTarget.ES2022,
        module: ts.ModuleKind.NodeNext,
        moduleResolution: ts.ModuleResolutionKind.NodeNext,
        types: ['node'],
        typeRoots: [join(root, 'node_modules', '@types')],
        noEmit: true,
        skipLibCheck: true,
        baseUrl: root,
        // onnxruntime-node (a devDependency) is what the ONNX example runs its export with.
        paths: {
          'resnet-cuda': ['lib/index.ts'],
          'onnxruntime-node': ['node_modules/onnxruntime-node/dist/index.d.ts'],
        },
        allowImportingTsExtensions: false,
      },
    );
    const problems = ts
      .getPreEmitDiagnostics(program)
      .filter((d): d is ts.Diagnostic & { file: ts.SourceFile } => d.file?.fileName.startsWith(work) === true)
      .map((d) => {
        const file = d.file;
        const index = Number(/typed-(\d+)\.ts$/.exec(file.fileName)?.[1] ?? -1);
        const { line } = file.getLineAndCharacterOfPosition(d.start ?? 0);
        // The written file starts with one added line.
        const where = index >= 0 ? `README.md:${examples[index]!.line + line - 1}` : file.fileName;
        return `${where}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`;
      });
    expect(problems).toEqual([]);
  });

  it.each(examples.map((b, i) => [b.line, i] as const))('the example at README.md:%i runs', async (_line, index) => {
    Object.assign(globalThis, {
      batchBytes: new Uint8Array(32 * 224 * 224 * 3).map((_, i) => (i * 37) % 251),
      labels: Int32Array.from({ length: 32 }, (_, i) => i % 10),
      trainLoader: shapesLoader(16, 1),
      valLoader: shapesLoader(8, 2),
      testLoader: shapesLoader(8, 3),
    });
    await import(files[index]!);
  });
});
