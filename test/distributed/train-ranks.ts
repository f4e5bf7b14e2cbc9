/**
 * Rank script of test/distributed-train.test.ts: joins the Gloo group from torchrun's variables,
 * runs the {@link RunSpec} given as JSON in the first argument as its rank (train-setup.ts), and
 * writes its report to `outDir/report-<rank>.json`.
 * @packageDocumentation
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { initProcessGroup } from '../../lib/distributed/process-group.js';
import { runSpec, type RunSpec } from './train-setup.js';

const spec = JSON.parse(process.argv[2] ?? '{}') as RunSpec;
const group = initProcessGroup({ backend: 'gloo', timeoutSeconds: spec.timeoutSeconds ?? 60 });
const report = await runSpec(spec, group, group.worldSize);
writeFileSync(join(spec.outDir, `report-${group.rank}.json`), JSON.stringify(report));
group.destroy();
