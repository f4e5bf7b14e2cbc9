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

/** Waits until all work queued on the device has finished (counted by {@link hostSyncStats}). */
export function synchronize(device = 'cpu'): void {
  const name = parseDevice(device);
  const start = performance.now();
  addon().synchronize({ device: name });
  countHostSync(start);
}

/** How often, and how long, the host has waited for a device's results in this process. */
export interface HostSyncStats {
  /** Waits so far: reads of device memory (`item()`, `toArray()`, ...), `synchronize()`, and copies to a CUDA device (which wait for its queue). */
  count: number;
  /** Time spent in them, in milliseconds (on the CPU only the copies: its ops have already run). */
  milliseconds: number;
}

let hostSyncCount = 0;
let hostSyncMs = 0;

/**
 * Counts one point where the host waited for a device, which began at `start` (a
 * `performance.now()` reading). The one place these waits are counted: the tensor reads, the
 * copies to a device and `synchronize` call it. @internal
 */
export function countHostSync(start: number): void {
  hostSyncCount++;
  hostSyncMs += performance.now() - start;
}

/**
 * The host's waits for a device so far in this process, running totals: take the difference of
 * two readings to measure a stretch of code. A wait on a CUDA device stops the host from queueing
 * more work, so that host and device stop overlapping; every read of a result (a loss `item()`)
 * is one.
 */
export function hostSyncStats(): HostSyncStats {
  return { count: hostSyncCount, milliseconds: hostSyncMs };
}

/**
 * A device's utilisation and memory as the NVIDIA driver reports them (what `nvidia-smi` shows),
 * read through NVML.
 */
export interface DeviceUtilization {
  /** Whether the driver gave a reading; false on the CPU, without NVML, or for a device NVML does not know. */
  available: boolean;
  /** Why there is no reading, when there is none. */
  reason?: string;
  /** Percent of the driver's last sample period (1/6 s to 1 s) during which a kernel ran. */
  gpuPercent: number;
  /** Percent of that period during which device memory was read or written. */
  memoryPercent: number;
  /** Device memory in use, by every process, in bytes. */
  memoryUsedBytes: number;
  /** The device's memory, in bytes. */
  memoryTotalBytes: number;
}

/**
 * The driver's utilisation and memory reading of `device` (NVML's `nvmlDeviceGetUtilizationRates`
 * and `nvmlDeviceGetMemoryInfo`, as `nvidia-smi` shows them). NVML is opened at run time; where it
 * is missing, on the CPU, or for a device it cannot identify, the reading says so (`available:
 * false` and `reason`) instead of failing. Does not wait for the device.
 */
export function deviceUtilization(device = 'cuda'): DeviceUtilization {
  return addon().deviceUtilization({ device: parseDevice(device) });
}

/** The package version the native addon was built from. */
export function nativeVersion(): string {
  return addon().version;
}
