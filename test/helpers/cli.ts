/**
 * Runs the command line in this process through `main(argv, io)`, capturing what it writes.
 * @packageDocumentation
 */
import { main } from '../../lib/cli/main.js';
import type { CliIO } from '../../lib/cli/options.js';

/** The exit code and the captured output of one command. */
export interface CliRun {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs `resnet-cuda <args>` in `cwd` with an empty environment. */
export async function runCli(args: string[], cwd: string): Promise<CliRun> {
  let stdout = '';
  let stderr = '';
  const io: CliIO = {
    stdout: { write: (s: string) => (stdout += s) },
    stderr: { write: (s: string) => (stderr += s) },
    env: {},
    cwd,
  };
  const code = await main(args, io);
  return { code, stdout, stderr };
}
