/**
 * The op test table, shared by the vitest suite (test/ops.test.ts) and the plain Node runner
 * (test/run-ops.ts): every case uploads fresh random inputs, runs one native op and compares it
 * with the float64 reference in test/reference/. No test framework is imported here.
 * @packageDocumentation
 */
import { badInputCases } from './bad-input-cases.js';
import { batchNormCases } from './batchnorm-cases.js';
import { convCases } from './conv-cases.js';
import { distillationBadInputCases, distillationCases, distillationGradientChecks } from './distillation-cases.js';
import { fakeQuantBadInputCases, fakeQuantCases } from './fake-quant-cases.js';
import { gradientChecks as referenceGradientChecks } from './gradient-checks.js';
import type { GradientCheck, OpCase } from './harness.js';
import { miscCases } from './misc-cases.js';
import { optimBadInputCases, optimCases } from './optim-cases.js';
import { poolCases } from './pool-cases.js';
import { specialValueCases } from './special-values-cases.js';
import { syncBatchNormBadInputCases, syncBatchNormCases } from './sync-batchnorm-cases.js';

export { badInputCases } from './bad-input-cases.js';
export { suiteSeed, TOLERANCE, type CaseContext, type GradientCheck, type OpCase } from './harness.js';

/** Every op case compared against the reference. */
export const opCases: OpCase[] = [
  ...convCases,
  ...poolCases,
  ...batchNormCases,
  ...syncBatchNormCases,
  ...miscCases,
  ...distillationCases,
  ...optimCases,
  ...specialValueCases,
  ...fakeQuantCases,
];

/** The whole table: op cases, then the inputs that must be rejected. */
export const cases: OpCase[] = [
  ...opCases,
  ...badInputCases,
  ...optimBadInputCases,
  ...distillationBadInputCases,
  ...fakeQuantBadInputCases,
  ...syncBatchNormBadInputCases,
];

/** Every reference backward against finite differences. */
export const gradientChecks: GradientCheck[] = [...referenceGradientChecks, ...distillationGradientChecks];

{
  const seen = new Set<string>();
  for (const c of cases) {
    if (seen.has(c.name)) throw new Error(`duplicate op case name: ${c.name}`);
    seen.add(c.name);
  }
}
