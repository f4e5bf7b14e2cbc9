/**
 * Devices, backends and memory statistics.
 * @packageDocumentation
 */
import { addon, type BackendStatus } from './binding.js';
import { ResnetError, describe } from './errors.js';

/** A device name: `'cpu'`, `'cuda'` (= `'cuda:0'`) or `'cuda:N'`. */
export type DeviceName = 'cpu' | 'cuda' | `cuda:${number}`;

/**
 * Validates a device name and returns its canonical form (`'cuda'` becomes `'cuda:0'`).
 * Throws `ERR_RC_DEVICE` for anything else.
 */
export function parseDevice(device: unknown, name = 'device'): string {
  if (device === 'cpu') return 'cpu';
  if (device === 'cuda') return 'cuda:0';
  if (typeof device === 'string' && /^cuda:\d{1,4}$/.test(device)) return `cuda:${Number(device.slice(5))}`;
  throw new ResnetError(
    'ERR_RC_DEVICE',
    `Expected 'cpu', 'cuda' or 'cuda:N' for ${name} but received ${describe(device)}`,
  );
}

/** What each backend was built with and whether it can be used now. */
export function listBackends(): BackendStatus[] {
  return addon().listBackends();
}

/** Whether a CUDA device is usable in this process. */
export function cudaAvailable(): boolean {
  return listBackends().some((b) => b.name === 'cuda' && b.available);
}

/** Memory held on a device by tensors (`allocatedBytes`) and by the caching allocator (`reservedBytes`). */
export interface MemoryStats {
  allocatedBytes: number;
  reservedBytes: number;
  peakAllocatedBytes: number;
  allocationCount: number;
  systemAllocationCount: number;
}

/** Allocator statistics for a device. */
export function memoryStats(device = 'cpu'): MemoryStats {
  return addon().memoryStats({ device: parseDevice(device) });
}

/** Resets `peakAllocatedBytes` to the current allocation. */
export function resetPeakMemory(device = 'cpu'): void {
  addon().resetPeakMemory({ device: parseDevice(device) });
}

/** Returns cached, unused blocks to the system. */
export function emptyCache(device = 'cpu'): void {
  addon().emptyCache({ device: parseDevice(device) });
}

/** Waits until all work queued on the device has finished. */
export function synchronize(device = 'cpu'): void {
  addon().synchronize({ device: parseDevice(device) });
}

/** The package version the native addon was built from. */
export function nativeVersion(): string {
  return addon().version;
}
