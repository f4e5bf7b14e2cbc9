/**
 * Rank script: joins a Gloo group from the torchrun environment and runs the collectives table
 * (test/helpers/collectives.ts), printing `ok <case>` per case, then one `records <json>` line with
 * the collectives the group's thread recorded. Exits non-zero with the error on failure.
 */
import { initProcessGroup } from '../../lib/index.js';
import { COLLECTIVE_CASES } from '../helpers/collectives.js';

const group = initProcessGroup({ backend: 'gloo', timeoutSeconds: 60 });
try {
  group.takeCollectiveRecords();
  for (const c of COLLECTIVE_CASES) {
    c.run(group);
    process.stdout.write(`ok ${c.name}\n`);
  }
  process.stdout.write(`records ${JSON.stringify(group.takeCollectiveRecords())}\n`);
} finally {
  group.destroy();
}
