import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { defined } from './helpers/defined.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as {
  exports: Record<string, Record<string, string> | string>;
  files: string[];
  repository?: { url?: string };
  homepage?: string;
  bugs?: { url?: string };
  cpu?: string[];
  license?: string;
  scripts: Record<string, string>;
};

describe('package.json', () => {
  it('has the fields a registry page and a platform check need', () => {
    expect(pkg.license).toBe('MIT');
    expect(pkg.repository?.url).toMatch(/^git\+https:\/\/github\.com\/.+\.git$/);
    expect(pkg.homepage).toMatch(/^https:\/\/github\.com\/.+#readme$/);
    expect(pkg.bugs?.url).toMatch(/^https:\/\/github\.com\/.+\/issues$/);
    expect(pkg.cpu).toEqual(['x64']);
    expect(readFileSync(join(root, 'LICENSE'), 'utf8')).toMatch(
      /^MIT License\n\nCopyright \(c\) The resnet-cuda authors\n/,
    );
  });

  it('resolves import first, then require to the CommonJS entry, and ships it', () => {
    const main = pkg.exports['.'] as Record<string, string>;
    expect(Object.keys(main)).toEqual(['types', 'import', 'require']);
    expect(pkg.files).toContain(defined(main.require, 'exports["."].require').replace(/^\.\//, ''));
  });

  it('keeps an install script, so that npm never runs node-gyp on its own for binding.gyp', () => {
    expect(pkg.scripts.install).toBe('node scripts/install.mjs');
    expect(pkg.files).toContain('binding.gyp');
  });
});

describe("require('resnet-cuda') from CommonJS", () => {
  let project: string;
  beforeAll(() => {
    // A CommonJS project with the package linked into node_modules, as `npm link` would.
    project = mkdtempSync(join(tmpdir(), 'resnet-cuda-cjs-'));
    mkdirSync(join(project, 'node_modules'));
    symlinkSync(root, join(project, 'node_modules', 'resnet-cuda'));
    writeFileSync(join(project, 'package.json'), '{"name":"cjs-consumer","private":true,"type":"commonjs"}\n');
    writeFileSync(
      join(project, 'main.js'),
      [
        'try {',
        "  const rc = require('resnet-cuda');",
        "  console.log(JSON.stringify({ loaded: typeof rc.ResNet50 === 'function' }));",
        '} catch (error) {',
        '  console.log(JSON.stringify({ code: error.code, message: error.message }));',
        '}',
        '',
      ].join('\n'),
    );
  });
  afterAll(() => rmSync(project, { recursive: true, force: true }));

  function run(nodeArgs: string[]): { loaded?: boolean; code?: string; message?: string } {
    const child = spawnSync(process.execPath, [...nodeArgs, 'main.js'], {
      cwd: project,
      encoding: 'utf8',
      timeout: 60_000,
    });
    expect(child.status, child.stderr).toBe(0);
    return JSON.parse(child.stdout.trim().split('\n').at(-1) ?? '') as {
      loaded?: boolean;
      code?: string;
      message?: string;
    };
  }

  // Node.js 20.19+ and 22.12+ can require() an ES module; --no-experimental-require-module turns it off.
  const flagKnown = spawnSync(process.execPath, ['--no-experimental-require-module', '-e', '0']).status === 0;

  it.skipIf(!flagKnown)('says the package is ESM and shows the import() line where Node cannot require ESM', () => {
    const result = run(['--no-experimental-require-module']);
    expect(result.code).toBe('ERR_REQUIRE_ESM');
    expect(result.message).toMatch(/^resnet-cuda is an ES module package/);
    expect(result.message).toContain("await import('resnet-cuda')");
    expect(result.message).toContain("import { ResNet50 } from 'resnet-cuda'");
  });

  it('loads the package where Node can require ES modules, or explains otherwise', () => {
    writeFileSync(join(project, 'probe.mjs'), 'export const probe = 1;\n');
    const probe = spawnSync(process.execPath, ['-e', "require('./probe.mjs')"], { cwd: project, timeout: 30_000 });
    const result = run([]);
    if (probe.status === 0) {
      expect(result).toEqual({ loaded: true });
    } else {
      expect(result.code).toBe('ERR_REQUIRE_ESM');
      expect(result.message).toContain("await import('resnet-cuda')");
    }
  });
});
