import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { addonLoadHint } from '../lib/binding.js';
import { ResnetError } from '../lib/errors.js';

const glibc = (process.report.getReport() as { header: { glibcVersionRuntime?: string } }).header.glibcVersionRuntime;
const installed = { root: '/nowhere/node_modules/resnet-cuda', version: '1.2.3' };
const noRepositoryScripts = /scripts\/|build:native|bash /;

describe('addonLoadHint: the cause, from the loader message', () => {
  it('names a missing system library and the package that has it', () => {
    const hint = addonLoadHint(
      new Error('libstdc++.so.6: cannot open shared object file: No such file or directory'),
      installed,
    );
    expect(hint).toMatch(/missing: libstdc\+\+\.so\.6/);
    expect(hint).toMatch(/apt-get install libstdc\+\+6/);
    expect(hint).toMatch(/npx resnet-cuda doctor/);
    expect(hint).not.toMatch(noRepositoryScripts);
  });

  it('calls a missing bundled library an incomplete install, never a system package', () => {
    for (const lib of ['libdnnl.so.3', 'libgomp.so.1']) {
      const hint = addonLoadHint(
        new Error(`${lib}: cannot open shared object file: No such file or directory`),
        installed,
      );
      expect(hint).toContain(`${lib} ships beside the prebuilt addon`);
      expect(hint).toContain('npm uninstall resnet-cuda && npm install resnet-cuda@1.2.3');
      expect(hint).not.toMatch(/apt-get/);
      expect(hint).not.toMatch(noRepositoryScripts);
    }
  });

  it('tells a source checkout missing oneDNN to run scripts/deps', () => {
    const root = fileURLToPath(new URL('..', import.meta.url));
    const hint = addonLoadHint(new Error('libdnnl.so.3: cannot open shared object file: No such file'), { root });
    expect(hint).toContain('bash scripts/deps');
    expect(hint).toContain('npm run build:native');
  });

  it('names a library it has no package for', () => {
    const hint = addonLoadHint(new Error('libfoo.so.7: cannot open shared object file: No such file'), installed);
    expect(hint).toMatch(/missing: libfoo\.so\.7/);
    expect(hint).toMatch(/provides libfoo\.so\.7/);
  });

  it('says which glibc the addon needs and which this system has', () => {
    const hint = addonLoadHint(
      new Error(
        "/lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.99' not found (required by /p/prebuilds/linux-x64/node.napi.glibc.node)",
      ),
      installed,
    );
    expect(hint).toMatch(/needs glibc 2\.99 or newer/);
    if (glibc) expect(hint).toContain(`this system has glibc ${glibc}`);
  });

  it('tells a too-old C++ runtime apart from glibc', () => {
    const hint = addonLoadHint(
      new Error("/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.99' not found (required by x.node)"),
      installed,
    );
    expect(hint).toMatch(/newer C\+\+ runtime \(libstdc\+\+ with GLIBCXX_3\.4\.99\)/);
    expect(hint).not.toMatch(/glibc 3/);
  });

  it('reads the cause of an ERR_RC_ADDON_LOAD error', () => {
    const wrapped = new ResnetError('ERR_RC_ADDON_LOAD', 'resnet-cuda: the native addon failed to load.');
    Object.assign(wrapped, { cause: new Error('/p/x.node: undefined symbol: _ZN4dnnl6engineC1Ev') });
    const hint = addonLoadHint(wrapped, installed);
    expect(hint).toMatch(/does not match a library/);
    expect(hint).toContain('npm rebuild resnet-cuda');
    expect(hint).toContain('npm install resnet-cuda@1.2.3');
  });

  it('calls a truncated file damaged', () => {
    const hint = addonLoadHint(new Error('/p/prebuilds/linux-x64/node.napi.glibc.node: file too short'), installed);
    expect(hint).toMatch(/damaged/);
  });

  it('sends an installed package without a binary to npm rebuild, and a source checkout to the build', () => {
    const message = 'No native build was found for platform=linux arch=x64 runtime=node abi=115 uv=1 libc=glibc';
    const hint = addonLoadHint(new Error(message), installed);
    if (process.platform === 'linux' && process.arch === 'x64' && glibc) {
      expect(hint).toMatch(/no prebuilt addon/);
      expect(hint).toContain('npm rebuild resnet-cuda');
      expect(hint).not.toMatch(noRepositoryScripts);
    } else {
      expect(hint).toMatch(/ships a prebuilt addon for Linux x64 with glibc only/);
    }
    const checkout = addonLoadHint(new Error(message), { root: fileURLToPath(new URL('..', import.meta.url)) });
    expect(checkout).toContain('npm run build:native');
    expect(checkout).toContain('npm run build:gyp');
  });
});

describe('addon(): a binary that does not load, in an installed package layout', () => {
  const dist = new URL('../dist/lib/', import.meta.url);
  const dirs: string[] = [];
  afterAll(() => {
    for (const d of dirs) rmSync(d, { recursive: true, force: true });
  });

  /** A package folder (compiled loader, no sources) whose prebuilt binary is `binary`'s output. */
  function installedPackage(binary: (file: string) => void): string {
    const dir = mkdtempSync(join(tmpdir(), 'resnet-cuda-load-hint-'));
    dirs.push(dir);
    mkdirSync(join(dir, 'lib'));
    for (const f of ['binding.js', 'errors.js', 'openmp-env.js', 'addon-load-hint.js']) {
      copyFileSync(new URL(f, dist), join(dir, 'lib', f));
    }
    writeFileSync(join(dir, 'package.json'), '{"name":"resnet-cuda","version":"9.8.7","type":"module"}');
    symlinkSync(fileURLToPath(new URL('../node_modules', import.meta.url)), join(dir, 'node_modules'));
    const prebuilds = join(dir, 'prebuilds', `${process.platform}-${process.arch}`);
    mkdirSync(prebuilds, { recursive: true });
    binary(join(prebuilds, 'node.napi.glibc.node'));
    return dir;
  }

  function load(dir: string): { code: string; message: string } {
    const program = `
      import { addon } from ${JSON.stringify(pathToFileURL(join(dir, 'lib', 'binding.js')).href)};
      try { addon(); console.log('{"code":"loaded"}'); }
      catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }`;
    const child = spawnSync(process.execPath, ['--input-type=module', '-e', program], {
      encoding: 'utf8',
      timeout: 30_000,
    });
    expect(child.status, child.stderr).toBe(0);
    return JSON.parse(child.stdout) as { code: string; message: string };
  }

  it('a file that is not a shared object: rebuild or reinstall', () => {
    const dir = installedPackage((file) => writeFileSync(file, 'not an ELF file\n'.repeat(256)));
    const { code, message } = load(dir);
    expect(code).toBe('ERR_RC_ADDON_LOAD');
    expect(message).toMatch(/invalid ELF header/);
    expect(message).toMatch(/damaged or was built for another kind of machine/);
    expect(message).toContain('npm rebuild resnet-cuda');
    expect(message).toContain('npm install resnet-cuda@9.8.7');
    expect(message).not.toMatch(noRepositoryScripts);
  });

  const cc = spawnSync('cc', ['--version']).status === 0;
  it.skipIf(!cc)('a shared library missing at load time: the library named from the dlopen message', () => {
    // A shared object linked against a library that is then deleted: dlopen reports its soname.
    const dir = installedPackage((file) => {
      const work = mkdtempSync(join(tmpdir(), 'resnet-cuda-missing-lib-'));
      dirs.push(work);
      writeFileSync(join(work, 'gone.c'), 'int rc_gone(void) { return 1; }\n');
      writeFileSync(join(work, 'addon.c'), 'int rc_gone(void);\nint rc_uses_gone(void) { return rc_gone(); }\n');
      const run = (args: string[]) => {
        const r = spawnSync('cc', args, { cwd: work, encoding: 'utf8' });
        expect(r.status, r.stderr).toBe(0);
      };
      run(['-shared', '-fPIC', '-o', 'librcgone.so.3', '-Wl,-soname,librcgone.so.3', 'gone.c']);
      run(['-shared', '-fPIC', '-o', file, 'addon.c', '-Wl,--no-as-needed', join(work, 'librcgone.so.3')]);
      rmSync(join(work, 'librcgone.so.3'));
    });
    const { code, message } = load(dir);
    expect(code).toBe('ERR_RC_ADDON_LOAD');
    expect(message).toMatch(/A shared library the addon needs is missing: librcgone\.so\.3\./);
    expect(message).toMatch(/provides librcgone\.so\.3/);
    expect(message).not.toMatch(noRepositoryScripts);
  });
});
