/**
 * Experiment tracking in MLflow's file-store layout, written directly (no Python, no server), so
 * that `mlflow ui --backend-store-uri ./mlruns` and `MlflowClient(tracking_uri='file:./mlruns')`
 * show our runs with their parameters, metric curves, tags and artifacts.
 *
 * The layout is the one MLflow's `FileStore` reads and writes
 * (mlflow/store/tracking/file_store.py in github.com/mlflow/mlflow):
 * - `<root>/<experiment_id>/meta.yaml`: `artifact_location`, `creation_time`, `experiment_id`,
 *   `last_update_time`, `lifecycle_stage`, `name` (experiment `0`, "Default", is made with the root);
 * - `<root>/<experiment_id>/<run_id>/meta.yaml`: the run's `RunInfo` (`run_id`, `run_uuid`,
 *   `run_name`, `experiment_id`, `user_id`, `status` as MLflow's integer enum: RUNNING 1,
 *   FINISHED 3, FAILED 4, KILLED 5; `start_time`, `end_time` in milliseconds, `artifact_uri`,
 *   `lifecycle_stage`), plus the fields `_make_persisted_run_info_dict` adds for older readers
 *   (`tags: []`, `source_type: 4` (LOCAL), empty `source_name`, `entry_point_name`,
 *   `source_version`, and `deleted_time`);
 * - `params/<key>`: the value as text, no newline; a key cannot change its value;
 * - `metrics/<key>`: one line per value, `"<timestamp ms> <value> <step>"`, appended;
 * - `tags/<key>`: the value as text (`mlflow.runName`, `mlflow.user`, `mlflow.source.name`,
 *   `mlflow.source.type`);
 * - `artifacts/`: files of the run.
 * Keys may hold `/` (`train/loss` is the file `metrics/train/loss`; the store walks the folder).
 *
 * The meta files, parameters and tags are replaced atomically (a temporary file renamed over
 * them); metric values are appended, one `write` per line.
 * @packageDocumentation
 */
import { randomBytes, randomUUID } from 'node:crypto';
import {
  closeSync,
  constants,
  copyFileSync,
  existsSync,
  linkSync,
  mkdirSync,
  openSync,
  readFileSync,
  readdirSync,
  renameSync,
  statSync,
  unlinkSync,
  writeFileSync,
  writeSync,
} from 'node:fs';
import { userInfo } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ResnetError, expectNumber, expectOptions, invalid } from '../../errors.js';

/** How a run ended, or that it is still going (MLflow's `RunStatus`). */
export type MlflowRunStatus = 'RUNNING' | 'FINISHED' | 'FAILED' | 'KILLED';

/** MLflow's `RunStatus` enum, the integers its file store keeps in `meta.yaml`. */
const STATUS_CODES: Record<MlflowRunStatus, number> = { RUNNING: 1, FINISHED: 3, FAILED: 4, KILLED: 5 };

/** `SourceType.LOCAL` in MLflow's enum. */
const SOURCE_TYPE_LOCAL = 4;

/** The experiment every store has, made with the root folder. */
const DEFAULT_EXPERIMENT = { id: '0', name: 'Default' };

/** MLflow's limits on keys and parameter values (mlflow/utils/validation.py: MAX_ENTITY_KEY_LENGTH, MAX_PARAM_VAL_LENGTH). */
const MAX_KEY_LENGTH = 250;
const MAX_PARAM_LENGTH = 6000;

/** Folders of the root that are not experiments. */
const NOT_EXPERIMENTS = new Set(['.trash', 'models']);

/** Options of {@link MlflowRun.start}. */
export interface MlflowRunOptions {
  /** The store's root folder (MLflow's `--backend-store-uri`); default `mlruns` in the working folder. */
  trackingDir?: string;
  /** The experiment, created when the store has none of that name; default MLflow's "Default" (id 0). */
  experimentName?: string;
  /** The run's name (tag `mlflow.runName`); default `run-<first 8 hex digits of the run id>`. */
  runName?: string;
  /** More tags to set on the run. */
  tags?: Record<string, string>;
}

/** A YAML scalar as our meta files hold it: a JSON string (a YAML double-quoted scalar), an integer, null or []. */
function yamlValue(value: string | number | null | readonly never[]): string {
  if (value === null) return 'null';
  if (typeof value === 'number') return String(value);
  if (Array.isArray(value)) return '[]';
  return JSON.stringify(value);
}

/** A flat YAML mapping, keys sorted as PyYAML's `safe_dump` sorts them. */
function toYaml(fields: Record<string, string | number | null | readonly never[]>): string {
  return (
    Object.keys(fields)
      .sort()
      .map((key) => `${key}: ${yamlValue(fields[key]!)}`)
      .join('\n') + '\n'
  );
}

/**
 * Reads the flat `key: value` mappings of the store's meta files, as PyYAML writes them (plain,
 * single- or double-quoted scalars; long plain scalars folded onto indented lines) or as we do.
 */
export function parseFlatYaml(text: string): Record<string, string | number | null> {
  const out: Record<string, string | number | null> = {};
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const match = /^([A-Za-z_][\w.]*):(?:\s+(.*))?$/.exec(lines[i]!);
    if (!match) continue;
    let raw = (match[2] ?? '').trim();
    // Continuation lines of a folded scalar are indented.
    while (i + 1 < lines.length && /^\s+\S/.test(lines[i + 1]!) && !/^\s*-/.test(lines[i + 1]!)) {
      raw += ' ' + lines[++i]!.trim();
    }
    out[match[1]!] = scalar(raw);
  }
  return out;
}

function scalar(raw: string): string | number | null {
  if (raw.startsWith('"')) return JSON.parse(raw) as string;
  if (raw.startsWith("'")) return raw.slice(1, -1).replace(/''/g, "'");
  if (raw === '' || raw === 'null' || raw === '~') return null;
  if (/^-?\d+$/.test(raw)) return Number(raw);
  return raw;
}

/** Writes `data` to `path` through a temporary file renamed over it, creating the folder. */
export function writeFileAtomicSync(path: string, data: string): void {
  mkdirSync(dirname(path), { recursive: true });
  const temporary = join(dirname(path), `.${basename(path)}.${randomBytes(6).toString('hex')}.tmp`);
  writeFileSync(temporary, data);
  try {
    renameSync(temporary, path);
  } catch (error) {
    unlinkSync(temporary);
    throw error;
  }
}

/**
 * Checks a metric, parameter or tag key as MLflow does: letters, digits, `_ - . space / :`, at
 * most 250 characters, and a relative path that stays inside its folder.
 */
function checkKey(kind: string, key: unknown): string {
  if (
    typeof key !== 'string' ||
    key.length === 0 ||
    key.length > MAX_KEY_LENGTH ||
    !/^[\w\-. /:]+$/.test(key) ||
    key.startsWith('/') ||
    key.split('/').some((part) => part === '' || part === '.' || part === '..')
  ) {
    invalid(
      `${kind} key`,
      `at most ${MAX_KEY_LENGTH} letters, digits, '_', '-', '.', ' ', ':' and '/' forming a relative path (MLflow's rule)`,
      key,
    );
  }
  return key;
}

/** The experiment folders of a store root with their meta files. */
function experiments(root: string): { id: string; dir: string; meta: Record<string, string | number | null> }[] {
  const out: { id: string; dir: string; meta: Record<string, string | number | null> }[] = [];
  for (const entry of readdirSync(root, { withFileTypes: true })) {
    if (!entry.isDirectory() || NOT_EXPERIMENTS.has(entry.name)) continue;
    const file = join(root, entry.name, 'meta.yaml');
    if (!existsSync(file)) continue;
    out.push({ id: entry.name, dir: join(root, entry.name), meta: parseFlatYaml(readFileSync(file, 'utf8')) });
  }
  return out;
}

/** Creates an experiment folder `id` with its meta file; false when the folder exists already. */
function createExperiment(root: string, id: string, name: string): boolean {
  const dir = join(root, id);
  try {
    mkdirSync(dir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw error;
  }
  const now = Date.now();
  writeFileAtomicSync(
    join(dir, 'meta.yaml'),
    toYaml({
      artifact_location: pathToFileURL(dir).href,
      creation_time: now,
      experiment_id: id,
      last_update_time: now,
      lifecycle_stage: 'active',
      name,
    }),
  );
  return true;
}

/** Opens a store root as MLflow's FileStore does: made with the default experiment and `.trash` when new. */
function openRoot(root: string): void {
  if (!existsSync(root)) {
    mkdirSync(root, { recursive: true });
    createExperiment(root, DEFAULT_EXPERIMENT.id, DEFAULT_EXPERIMENT.name);
  } else if (!statSync(root).isDirectory()) {
    invalid('mlflow trackingDir', 'a folder (an MLflow file store)', root);
  }
  mkdirSync(join(root, '.trash'), { recursive: true });
}

/** The id of the active experiment named `name`, created (the next free integer id) when there is none. */
function experimentId(root: string, name: string): string {
  const existing = experiments(root).find((e) => e.meta.name === name && e.meta.lifecycle_stage !== 'deleted');
  if (existing) return existing.id;
  const ids = experiments(root)
    .map((e) => Number(e.id))
    .filter((n) => Number.isSafeInteger(n));
  // mkdir is the lock: another process taking the same id makes us try the next one.
  for (let id = Math.max(0, ...ids) + 1; ; id++) {
    if (createExperiment(root, String(id), name)) return String(id);
  }
}

/** The run's fields of `meta.yaml`, as `FileStore` persists a `RunInfo`. */
interface RunInfo {
  runId: string;
  runName: string;
  experimentId: string;
  userId: string;
  status: MlflowRunStatus;
  startTime: number;
  endTime: number | null;
  artifactUri: string;
}

function runInfoYaml(info: RunInfo): string {
  return toYaml({
    artifact_uri: info.artifactUri,
    deleted_time: null,
    end_time: info.endTime,
    entry_point_name: '',
    experiment_id: info.experimentId,
    lifecycle_stage: 'active',
    run_id: info.runId,
    run_name: info.runName,
    run_uuid: info.runId,
    source_name: '',
    source_type: SOURCE_TYPE_LOCAL,
    source_version: '',
    start_time: info.startTime,
    status: STATUS_CODES[info.status],
    tags: [],
    user_id: info.userId,
  });
}

function currentUser(): string {
  try {
    return userInfo().username;
  } catch {
    return 'unknown';
  }
}

/**
 * One MLflow run in a file store: parameters, metrics, tags and artifacts, written as MLflow's
 * own `FileStore` would (see the module documentation for the layout).
 *
 * ```ts
 * const run = MlflowRun.start({ trackingDir: 'mlruns', experimentName: 'resnet50', runName: 'lr-0.1' });
 * run.logParams({ lr: 0.1, batch_size: 256 });
 * run.logMetric('train/loss', 2.31, 100);
 * run.logArtifact('runs/r50/model.safetensors');
 * run.end('FINISHED');
 * ```
 */
export class MlflowRun {
  /** The store's root folder, absolute. */
  readonly trackingDir: string;
  /** The experiment's id (its folder's name). */
  readonly experimentId: string;
  /** The run's id, 32 hex digits (its folder's name). */
  readonly runId: string;
  /** The run's folder. */
  readonly runDir: string;
  readonly #info: RunInfo;
  readonly #metrics = new Map<string, number>();

  private constructor(trackingDir: string, runDir: string, info: RunInfo) {
    this.trackingDir = trackingDir;
    this.experimentId = info.experimentId;
    this.runId = info.runId;
    this.runDir = runDir;
    this.#info = info;
  }

  /** Starts a new run (status RUNNING) in the experiment named by `options`, creating the store and the experiment as needed. */
  static start(options: MlflowRunOptions = {}): MlflowRun {
    const o = expectOptions<MlflowRunOptions>('MlflowRun options', options, [
      'trackingDir',
      'experimentName',
      'runName',
      'tags',
    ]);
    const root = resolve(checkText('trackingDir', o.trackingDir ?? 'mlruns'));
    const experimentName = checkText('experimentName', o.experimentName ?? DEFAULT_EXPERIMENT.name);
    const tags = o.tags ?? {};
    if (tags === null || typeof tags !== 'object' || Object.values(tags).some((v) => typeof v !== 'string')) {
      invalid('tags', 'an object of string values', tags);
    }
    for (const key of Object.keys(tags)) checkKey('tag', key);
    openRoot(root);
    const expId = experimentId(root, experimentName);
    const runId = randomUUID().replace(/-/g, '');
    const runName = checkText('runName', o.runName ?? `run-${runId.slice(0, 8)}`);
    const runDir = join(root, expId, runId);
    mkdirSync(runDir);
    for (const folder of ['metrics', 'params', 'tags', 'artifacts']) mkdirSync(join(runDir, folder));
    const info: RunInfo = {
      runId,
      runName,
      experimentId: expId,
      userId: currentUser(),
      status: 'RUNNING',
      startTime: Date.now(),
      endTime: null,
      artifactUri: pathToFileURL(join(runDir, 'artifacts')).href,
    };
    writeFileAtomicSync(join(runDir, 'meta.yaml'), runInfoYaml(info));
    const run = new MlflowRun(root, runDir, info);
    run.setTags({
      'mlflow.runName': runName,
      'mlflow.user': info.userId,
      'mlflow.source.name': process.argv[1] ? basename(process.argv[1]) : 'node',
      'mlflow.source.type': 'LOCAL',
      ...tags,
    });
    return run;
  }

  /**
   * Reopens run `runId` of the store at `trackingDir` (to continue a resumed training run): its
   * status goes back to RUNNING and its end time is cleared. Returns null when the store holds no
   * such run.
   */
  static reopen(trackingDir: string, runId: string): MlflowRun | null {
    const root = resolve(checkText('trackingDir', trackingDir));
    if (typeof runId !== 'string' || !/^[0-9a-f]{32}$/.test(runId)) {
      invalid('runId', 'a run id of 32 hex digits', runId);
    }
    if (!existsSync(root)) return null;
    for (const experiment of experiments(root)) {
      const file = join(experiment.dir, runId, 'meta.yaml');
      if (!existsSync(file)) continue;
      const meta = parseFlatYaml(readFileSync(file, 'utf8'));
      const info: RunInfo = {
        runId,
        runName: String(meta.run_name ?? ''),
        experimentId: experiment.id,
        userId: String(meta.user_id ?? currentUser()),
        status: 'RUNNING',
        startTime: typeof meta.start_time === 'number' ? meta.start_time : Date.now(),
        endTime: null,
        artifactUri: String(meta.artifact_uri ?? pathToFileURL(join(experiment.dir, runId, 'artifacts')).href),
      };
      const run = new MlflowRun(root, join(experiment.dir, runId), info);
      run.#writeInfo();
      return run;
    }
    return null;
  }

  /** The run's name (tag `mlflow.runName`). */
  get runName(): string {
    return this.#info.runName;
  }

  /** RUNNING until {@link MlflowRun.end}. */
  get status(): MlflowRunStatus {
    return this.#info.status;
  }

  /** The folder artifacts are stored in. */
  get artifactDir(): string {
    return join(this.runDir, 'artifacts');
  }

  /**
   * Records a parameter (`mlflow.log_param`). As in MLflow a parameter cannot change: logging
   * another value for a key already logged throws, unless `keepExisting` is set, which leaves the
   * first value (a resumed run logging its options again). Values longer than MLflow's 6000
   * characters are cut there.
   */
  logParam(key: string, value: string | number | boolean, options: { keepExisting?: boolean } = {}): void {
    this.#checkOpen('logParam');
    checkKey('param', key);
    if (typeof value !== 'string' && typeof value !== 'number' && typeof value !== 'boolean') {
      invalid(`param '${key}'`, 'a string, number or boolean', value);
    }
    const text = String(value).slice(0, MAX_PARAM_LENGTH);
    const path = join(this.runDir, 'params', key);
    if (existsSync(path)) {
      const current = readFileSync(path, 'utf8');
      if (current === text || options.keepExisting) return;
      throw new ResnetError(
        'ERR_RC_INVALID_ARGUMENT',
        `MlflowRun.logParam: param '${key}' was already logged as '${current}' for run ${this.runId}; MLflow parameters cannot change (new value '${text}')`,
      );
    }
    writeFileAtomicSync(path, text);
  }

  /** {@link MlflowRun.logParam} for each entry. */
  logParams(params: Record<string, string | number | boolean>, options: { keepExisting?: boolean } = {}): void {
    if (params === null || typeof params !== 'object') invalid('params', 'an object of parameters', params);
    for (const [key, value] of Object.entries(params)) this.logParam(key, value, options);
  }

  /**
   * Appends a metric value (`mlflow.log_metric`): NaN and infinities are kept, as MLflow keeps
   * them. `step` is an integer (default 0), `timestamp` milliseconds since the epoch (default now).
   */
  logMetric(key: string, value: number, step = 0, timestamp: number = Date.now()): void {
    this.#checkOpen('logMetric');
    checkKey('metric', key);
    if (typeof value !== 'number') invalid(`metric '${key}'`, 'a number', value);
    if (!Number.isSafeInteger(step)) invalid('step', 'an integer', step);
    const ms = Math.round(expectNumber('timestamp', timestamp, 0));
    let fd = this.#metrics.get(key);
    if (fd === undefined) {
      const path = join(this.runDir, 'metrics', key);
      mkdirSync(dirname(path), { recursive: true });
      fd = openSync(path, 'a');
      this.#metrics.set(key, fd);
    }
    // Python's float() reads JavaScript's shortest round-trip form, "NaN" and "Infinity" included.
    writeSync(fd, `${ms} ${String(value)} ${step}\n`);
  }

  /** Sets a tag (`mlflow.set_tag`), replacing its value. */
  setTag(key: string, value: string): void {
    this.#checkOpen('setTag');
    checkKey('tag', key);
    if (typeof value !== 'string') invalid(`tag '${key}'`, 'a string', value);
    writeFileAtomicSync(join(this.runDir, 'tags', key), value);
  }

  /** {@link MlflowRun.setTag} for each entry. */
  setTags(tags: Record<string, string>): void {
    for (const [key, value] of Object.entries(tags)) this.setTag(key, value);
  }

  /**
   * Stores a file as an artifact (`mlflow.log_artifact`), under `artifactPath` (a folder of the
   * artifacts, default their root), replacing one of the same name. The file is hard-linked when
   * it can be (no copy of large weights; our files are replaced by rename, never rewritten in
   * place, so the artifact keeps the content it had), else copied. Returns the artifact's path.
   */
  logArtifact(file: string, artifactPath = ''): string {
    this.#checkOpen('logArtifact');
    if (typeof file !== 'string' || !existsSync(file) || !statSync(file).isFile()) {
      invalid('file', 'the path of an existing file', file);
    }
    if (artifactPath !== '') checkKey('artifact path', artifactPath);
    const target = join(this.artifactDir, artifactPath, basename(file));
    mkdirSync(dirname(target), { recursive: true });
    const temporary = join(dirname(target), `.${basename(target)}.${randomBytes(6).toString('hex')}.tmp`);
    try {
      linkSync(file, temporary);
    } catch {
      copyFileSync(file, temporary, constants.COPYFILE_FICLONE);
    }
    renameSync(temporary, target);
    return target;
  }

  /** Ends the run: its status (FINISHED, FAILED or KILLED) and end time go to `meta.yaml`; the metric files are closed. */
  end(status: Exclude<MlflowRunStatus, 'RUNNING'> = 'FINISHED'): void {
    if (!['FINISHED', 'FAILED', 'KILLED'].includes(status)) {
      invalid('status', "'FINISHED', 'FAILED' or 'KILLED'", status);
    }
    this.#closeMetrics();
    if (this.#info.status !== 'RUNNING') return;
    this.#info.status = status;
    this.#info.endTime = Date.now();
    this.#writeInfo();
  }

  /** Closes the metric files without ending the run (it stays RUNNING, as a crashed run does). */
  close(): void {
    this.#closeMetrics();
  }

  #closeMetrics(): void {
    for (const fd of this.#metrics.values()) closeSync(fd);
    this.#metrics.clear();
  }

  #writeInfo(): void {
    writeFileAtomicSync(join(this.runDir, 'meta.yaml'), runInfoYaml(this.#info));
  }

  #checkOpen(method: string): void {
    if (this.#info.status !== 'RUNNING') {
      throw new ResnetError(
        'ERR_RC_DISPOSED',
        `MlflowRun.${method}: run ${this.runId} has ended (${this.#info.status}); reopen it with MlflowRun.reopen`,
      );
    }
  }
}

function checkText(name: string, value: unknown): string {
  if (typeof value !== 'string' || value.length === 0) invalid(name, 'a non-empty string', value);
  return value;
}

/**
 * Flattens a JSON-like object into MLflow parameters: nested objects become dotted keys
 * (`optimizer.lr`), arrays and other values their JSON text, strings themselves; keys are made
 * MLflow-safe (other characters become `_`).
 */
export function flattenParams(value: Record<string, unknown>, prefix = ''): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [rawKey, v] of Object.entries(value)) {
    const key = prefix + rawKey.replace(/[^\w\-. /:]/g, '_');
    if (v === undefined || typeof v === 'function') continue;
    if (v !== null && typeof v === 'object' && !Array.isArray(v)) {
      Object.assign(out, flattenParams(v as Record<string, unknown>, `${key}.`));
    } else out[key] = typeof v === 'string' ? v : JSON.stringify(v);
  }
  return out;
}
