/**
 * What to do when the native addon does not load: the cause read from the loader's message
 * (no binary for this platform, a shared library that is missing, a C library or C++ runtime that
 * is too old, a binary for another machine) and the commands that fix it in an installed package.
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import { join } from 'node:path';

/** The Debian/Ubuntu package of each system library the addon may link, by soname prefix. */
const DEBIAN_PACKAGES: readonly (readonly [prefix: string, pkg: string])[] = [
  ['libstdc++.so', 'libstdc++6'],
  ['libgcc_s.so', 'libgcc-s1'],
];

/** The libraries the prebuilt addon carries beside it (prebuilds/linux-x64/), by soname prefix. */
const BUNDLED_LIBRARIES: readonly string[] = ['libdnnl.so', 'libgomp.so'];

/** Where the package is, for the hint: its root folder and version, when known. */
export interface AddonLoadContext {
  /** The package root (the folder with package.json). */
  root?: string;
  /** The package version, for the reinstall command. */
  version?: string;
}

/** The loader's own message: the `cause` of an `ERR_RC_ADDON_LOAD` error, else the error's message. */
function loaderMessage(error: unknown): string {
  const cause = error instanceof Error ? (error as Error & { cause?: unknown }).cause : undefined;
  const source = cause instanceof Error ? cause : error;
  return source instanceof Error ? source.message : String(source);
}

/** The glibc version this process runs with (`2.36`), or undefined where there is none (musl). */
function runtimeGlibc(): string | undefined {
  const header = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header;
  return header?.glibcVersionRuntime;
}

/** Whether `root` is a source checkout (it has the TypeScript sources), where CMake builds the addon. */
function isSourceCheckout(root: string | undefined): boolean {
  return root !== undefined && existsSync(join(root, 'tsconfig.json')) && existsSync(join(root, 'lib'));
}

/**
 * The hint for a native addon that does not load: the cause named from the loader's message and
 * the commands that fix it. Every command works in an installed package (`npm rebuild resnet-cuda`,
 * `npx resnet-cuda doctor`, a reinstall, the system's package manager); a source checkout is told
 * to build the addon. `resnet-cuda doctor` prints it for a failed load.
 * @param error - the `ERR_RC_ADDON_LOAD` error of the loader, or the loader's own error.
 * @param context - the package root and version (the loader passes them; optional).
 * @returns one or more lines, each a sentence.
 */
export function addonLoadHint(error: unknown, context: AddonLoadContext = {}): string {
  const message = loaderMessage(error);
  const reinstall = `npm uninstall resnet-cuda && npm install resnet-cuda${context.version ? `@${context.version}` : ''}`;
  const verify = 'then check with `npx resnet-cuda doctor`.';
  const lines: string[] = [];

  const tooOld = /version `(GLIBC|GLIBCXX|CXXABI)_([\d.]+)' not found/.exec(message);
  const missing = /(lib[\w.+-]+\.so[\w.]*): cannot open shared object file/.exec(message);
  if (message.includes('No native build was found')) {
    const tuple = `${process.platform}-${process.arch}`;
    const glibc = runtimeGlibc();
    if (isSourceCheckout(context.root)) {
      lines.push(
        `No addon is built in this source checkout (${join(context.root ?? '.', 'build/Release')} is empty) and no prebuilt binary matches ${tuple}.`,
        'Build it with `npm run build:native` (CMake), or without CMake with `npm run build:gyp` (node-gyp, CPU only).',
      );
    } else if (tuple !== 'linux-x64' || glibc === undefined) {
      lines.push(
        `resnet-cuda ships a prebuilt addon for Linux x64 with glibc only; this is ${tuple}${glibc === undefined && process.platform === 'linux' ? ' without glibc (musl?)' : ''}.`,
        'Use a glibc-based Linux x64 machine or container (Debian, Ubuntu, RHEL and their derivatives).',
      );
    } else {
      lines.push(
        'The installed package has no prebuilt addon (its prebuilds/ folder is missing or incomplete, or its install step was skipped, as with --ignore-scripts).',
        `Run \`npm rebuild resnet-cuda\`; if that does not help, reinstall it: \`${reinstall}\`; ${verify}`,
      );
    }
  } else if (tooOld) {
    const [, what, needed] = tooOld;
    if (what === 'GLIBC') {
      const glibc = runtimeGlibc();
      lines.push(
        `The addon needs glibc ${needed} or newer; this system has ${glibc ? `glibc ${glibc}` : 'an older one'}.`,
        'Use a newer Linux distribution (or container) whose glibc is at least that version.',
      );
    } else {
      lines.push(
        `The addon needs a newer C++ runtime (libstdc++ with ${what}_${needed}) than this system's.`,
        'Update libstdc++ (Debian/Ubuntu: `sudo apt-get install libstdc++6`, from a release that has it) or use a newer distribution.',
      );
    }
  } else if (missing && BUNDLED_LIBRARIES.some((prefix) => missing[1]!.startsWith(prefix))) {
    const lib = missing[1]!;
    lines.push(
      isSourceCheckout(context.root)
        ? `${lib} is missing: a source build links the copy that \`bash scripts/deps\` installs in the cache. Run it, then \`npm run build:native\`.`
        : `${lib} ships beside the prebuilt addon (prebuilds/linux-x64/) and is missing there: the installed package is incomplete.`,
      `Reinstall it: \`${reinstall}\`; ${verify}`,
    );
  } else if (missing) {
    const lib = missing[1]!;
    const pkg = DEBIAN_PACKAGES.find(([prefix]) => lib.startsWith(prefix))?.[1];
    lines.push(
      `A shared library the addon needs is missing: ${lib}.`,
      pkg
        ? `Install it (Debian/Ubuntu: \`sudo apt-get install ${pkg}\`), ${verify}`
        : `Install the package that provides ${lib} with the system's package manager, ${verify}`,
    );
  } else if (
    /invalid ELF header|wrong ELF class|ELFCLASS|file too short|cannot open shared object file/.test(message)
  ) {
    lines.push(
      'The addon file is damaged or was built for another kind of machine (a node_modules folder copied from elsewhere?).',
      `Rebuild the package for this machine: \`npm rebuild resnet-cuda\`; if that does not help: \`${reinstall}\`; ${verify}`,
    );
  } else if (message.includes('undefined symbol')) {
    lines.push(
      'The addon does not match a library it was linked with (a library replaced since it was built).',
      `Run \`npm rebuild resnet-cuda\`; if that does not help: \`${reinstall}\`; ${verify}`,
    );
  } else {
    lines.push(`Run \`npm rebuild resnet-cuda\`; if that does not help: \`${reinstall}\`; ${verify}`);
  }
  return lines.join('\n');
}
