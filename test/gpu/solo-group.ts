/**
 * A process group of this process alone, whatever the environment says: the tests of the
 * collectives' users (DistributedDataParallel, SyncBatchNorm) on one rank.
 * @packageDocumentation
 */
import { initProcessGroup } from '../../lib/distributed/process-group.js';
import type { ProcessGroup, ProcessGroupBackend } from '../../lib/distributed/types.js';

/** A group of one rank on `backend` (`device` defaults to the backend's: `cpu` for Gloo). */
export function soloGroup(backend: ProcessGroupBackend, device?: string, timeoutSeconds = 60): ProcessGroup {
  return initProcessGroup({
    backend,
    ...(device !== undefined ? { device } : {}),
    rank: 0,
    worldSize: 1,
    localRank: 0,
    localWorldSize: 1,
    masterAddr: '127.0.0.1',
    masterPort: 0,
    token: '',
    timeoutSeconds,
  });
}
