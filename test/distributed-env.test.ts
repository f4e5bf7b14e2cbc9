import { describe, expect, it, vi } from 'vitest';
import {
  expandSlurmHostList,
  expandSlurmTasksPerNode,
  rendezvousFromEnv,
  slurmDefaultPort,
} from '../lib/distributed/env.js';
import type { RendezvousInfo } from '../lib/distributed/types.js';

/** A 2-node x 4-task srun step, seen from the second task of the second node. */
const SLURM: Record<string, string> = {
  SLURM_PROCID: '5',
  SLURM_NTASKS: '8',
  SLURM_LOCALID: '1',
  SLURM_NODEID: '1',
  SLURM_TASKS_PER_NODE: '4(x2)',
  SLURM_JOB_NODELIST: 'gpu[07-08]',
  SLURM_JOB_ID: '4321',
};

/** What torchrun gives the third worker of a 2-node x 2-process job. */
const TORCHRUN: Record<string, string> = {
  RANK: '2',
  WORLD_SIZE: '4',
  LOCAL_RANK: '0',
  LOCAL_WORLD_SIZE: '2',
  MASTER_ADDR: 'node-a.cluster',
  MASTER_PORT: '29500',
};

/** What mpirun -np 4 -N 2 -x MASTER_ADDR -x MASTER_PORT gives its last process. */
const MPI: Record<string, string> = {
  OMPI_COMM_WORLD_RANK: '3',
  OMPI_COMM_WORLD_SIZE: '4',
  OMPI_COMM_WORLD_LOCAL_RANK: '1',
  OMPI_COMM_WORLD_LOCAL_SIZE: '2',
  MASTER_ADDR: '10.0.0.1',
  MASTER_PORT: '6000',
};

type Expected = Omit<RendezvousInfo, 'token'>;

const GOOD: { name: string; env: Record<string, string>; expected: Expected }[] = [
  {
    name: 'nothing set: a job of one process on 127.0.0.1, any free port',
    env: {},
    expected: {
      rank: 0,
      worldSize: 1,
      localRank: 0,
      localWorldSize: 1,
      masterAddr: '127.0.0.1',
      masterPort: 0,
      source: 'explicit',
    },
  },
  {
    name: 'torchrun',
    env: TORCHRUN,
    expected: {
      rank: 2,
      worldSize: 4,
      localRank: 0,
      localWorldSize: 2,
      masterAddr: 'node-a.cluster',
      masterPort: 29500,
      source: 'torchrun',
    },
  },
  {
    name: 'torchrun without LOCAL_RANK (a PyTorchJob pod): alone on its node',
    env: { RANK: '1', WORLD_SIZE: '3', MASTER_ADDR: 'master-0', MASTER_PORT: '23456' },
    expected: {
      rank: 1,
      worldSize: 3,
      localRank: 0,
      localWorldSize: 1,
      masterAddr: 'master-0',
      masterPort: 23456,
      source: 'torchrun',
    },
  },
  {
    name: 'torchrun, world of one without a master',
    env: { RANK: '0', WORLD_SIZE: '1', LOCAL_RANK: '0', LOCAL_WORLD_SIZE: '1' },
    expected: {
      rank: 0,
      worldSize: 1,
      localRank: 0,
      localWorldSize: 1,
      masterAddr: '127.0.0.1',
      masterPort: 0,
      source: 'torchrun',
    },
  },
  {
    name: 'torchrun with an IPv6 master in brackets',
    env: { ...TORCHRUN, MASTER_ADDR: '[fd00::1]' },
    expected: {
      rank: 2,
      worldSize: 4,
      localRank: 0,
      localWorldSize: 2,
      masterAddr: 'fd00::1',
      masterPort: 29500,
      source: 'torchrun',
    },
  },
  {
    name: 'torchrun wins over SLURM and MPI (a launcher started by srun)',
    env: { ...SLURM, ...MPI, ...TORCHRUN },
    expected: {
      rank: 2,
      worldSize: 4,
      localRank: 0,
      localWorldSize: 2,
      masterAddr: 'node-a.cluster',
      masterPort: 29500,
      source: 'torchrun',
    },
  },
  {
    name: 'SLURM: master from the node list, port from the job id',
    env: SLURM,
    expected: {
      rank: 5,
      worldSize: 8,
      localRank: 1,
      localWorldSize: 4,
      masterAddr: 'gpu07',
      masterPort: 10000 + 4321,
      source: 'slurm',
    },
  },
  {
    name: 'SLURM: uneven nodes, this node the third',
    env: {
      ...SLURM,
      SLURM_PROCID: '8',
      SLURM_NTASKS: '9',
      SLURM_LOCALID: '0',
      SLURM_NODEID: '2',
      SLURM_TASKS_PER_NODE: '4(x2),1',
      SLURM_JOB_NODELIST: 'rack[2-3]-n[01-02],login',
      SLURM_JOB_ID: '987654',
    },
    expected: {
      rank: 8,
      worldSize: 9,
      localRank: 0,
      localWorldSize: 1,
      masterAddr: 'rack2-n01',
      masterPort: 10000 + (987654 % 20000),
      source: 'slurm',
    },
  },
  {
    name: "SLURM: the step's tasks per node before the job's, MASTER_ADDR/PORT before the derived ones",
    env: {
      ...SLURM,
      SLURM_STEP_TASKS_PER_NODE: '2(x4)',
      SLURM_NTASKS_PER_NODE: '4',
      SLURM_NODEID: '2',
      MASTER_ADDR: 'head',
      MASTER_PORT: '7000',
    },
    expected: {
      rank: 5,
      worldSize: 8,
      localRank: 1,
      localWorldSize: 2,
      masterAddr: 'head',
      masterPort: 7000,
      source: 'slurm',
    },
  },
  {
    name: 'SLURM wins over MPI',
    env: { ...MPI, ...SLURM, MASTER_ADDR: '', MASTER_PORT: '' },
    expected: {
      rank: 5,
      worldSize: 8,
      localRank: 1,
      localWorldSize: 4,
      masterAddr: 'gpu07',
      masterPort: 14321,
      source: 'slurm',
    },
  },
  {
    name: 'Open MPI',
    env: MPI,
    expected: {
      rank: 3,
      worldSize: 4,
      localRank: 1,
      localWorldSize: 2,
      masterAddr: '10.0.0.1',
      masterPort: 6000,
      source: 'mpi',
    },
  },
];

describe('rendezvousFromEnv', () => {
  it.each(GOOD)('$name', ({ env, expected }) => {
    expect(rendezvousFromEnv({ ...env, RESNET_STORE_TOKEN: 'secret' })).toEqual({ ...expected, token: 'secret' });
  });

  it('reads the token from RESNET_STORE_TOKEN, empty when unset', () => {
    expect(rendezvousFromEnv(TORCHRUN).token).toBe('');
    expect(rendezvousFromEnv({ ...MPI, RESNET_STORE_TOKEN: 'abc' }).token).toBe('abc');
  });

  it('reads process.env by default', () => {
    try {
      // An empty variable counts as unset.
      for (const key of Object.keys(process.env)) {
        if (/^(RANK|WORLD_SIZE|LOCAL_|MASTER_|SLURM_|OMPI_)/.test(key)) vi.stubEnv(key, '');
      }
      for (const [key, value] of Object.entries(MPI)) vi.stubEnv(key, value);
      expect(rendezvousFromEnv()).toMatchObject({ rank: 3, worldSize: 4, source: 'mpi' });
    } finally {
      vi.unstubAllEnvs();
    }
  });

  /** Each row: the environment and the words the error must contain (the variable and its value). */
  const BAD: { name: string; env: Record<string, string>; message: RegExp }[] = [
    { name: 'RANK not a number', env: { ...TORCHRUN, RANK: 'two' }, message: /variable RANK .*'two'/ },
    { name: 'RANK negative', env: { ...TORCHRUN, RANK: '-1' }, message: /variable RANK .*'-1'/ },
    { name: 'RANK a fraction', env: { ...TORCHRUN, RANK: '1.5' }, message: /variable RANK .*'1\.5'/ },
    {
      name: 'RANK outside the world',
      env: { ...TORCHRUN, RANK: '4' },
      message: /rank below WORLD_SIZE=4 .*RANK .*'4'/,
    },
    {
      name: 'WORLD_SIZE zero',
      env: { ...TORCHRUN, WORLD_SIZE: '0' },
      message: /at least 1 for the environment variable WORLD_SIZE .*'0'/,
    },
    { name: 'RANK missing', env: { WORLD_SIZE: '2' }, message: /RANK is not set/ },
    { name: 'WORLD_SIZE missing', env: { RANK: '0' }, message: /WORLD_SIZE is not set/ },
    {
      name: 'LOCAL_WORLD_SIZE missing',
      env: { ...TORCHRUN, LOCAL_WORLD_SIZE: '' },
      message: /LOCAL_WORLD_SIZE is not set \(LOCAL_RANK is set\)/,
    },
    {
      name: 'LOCAL_RANK outside the node',
      env: { ...TORCHRUN, LOCAL_RANK: '2' },
      message: /local rank below LOCAL_WORLD_SIZE=2 .*LOCAL_RANK .*'2'/,
    },
    {
      name: 'LOCAL_WORLD_SIZE above the world',
      env: { ...TORCHRUN, LOCAL_WORLD_SIZE: '5' },
      message: /LOCAL_WORLD_SIZE .*'5'/,
    },
    { name: 'MASTER_ADDR missing', env: { ...TORCHRUN, MASTER_ADDR: '' }, message: /MASTER_ADDR is not set/ },
    { name: 'MASTER_PORT missing', env: { ...TORCHRUN, MASTER_PORT: '' }, message: /MASTER_PORT is not set/ },
    {
      name: 'MASTER_ADDR malformed',
      env: { ...TORCHRUN, MASTER_ADDR: 'bad host' },
      message: /host name or an IP address for the environment variable MASTER_ADDR .*'bad host'/,
    },
    {
      name: 'MASTER_ADDR with a port',
      env: { ...TORCHRUN, MASTER_ADDR: 'node:29500' },
      message: /MASTER_ADDR .*'node:29500'/,
    },
    {
      name: 'MASTER_PORT out of range',
      env: { ...TORCHRUN, MASTER_PORT: '70000' },
      message: /between 1 and 65535 for the environment variable MASTER_PORT .*'70000'/,
    },
    {
      name: 'MASTER_PORT zero with other ranks',
      env: { ...TORCHRUN, MASTER_PORT: '0' },
      message: /between 1 and 65535 for the environment variable MASTER_PORT .*'0'/,
    },
    { name: 'MASTER_PORT a name', env: { ...TORCHRUN, MASTER_PORT: 'http' }, message: /MASTER_PORT .*'http'/ },
    { name: 'SLURM_PROCID malformed', env: { ...SLURM, SLURM_PROCID: 'x' }, message: /SLURM_PROCID .*'x'/ },
    {
      name: 'SLURM_PROCID outside the world',
      env: { ...SLURM, SLURM_PROCID: '8' },
      message: /rank below SLURM_NTASKS=8 .*SLURM_PROCID .*'8'/,
    },
    { name: 'SLURM_NTASKS missing', env: { ...SLURM, SLURM_NTASKS: '' }, message: /SLURM_NTASKS is not set/ },
    {
      name: 'SLURM_LOCALID outside the node',
      env: { ...SLURM, SLURM_LOCALID: '4' },
      message: /local rank below SLURM_TASKS_PER_NODE=4 .*SLURM_LOCALID .*'4'/,
    },
    {
      name: 'SLURM_TASKS_PER_NODE malformed',
      env: { ...SLURM, SLURM_TASKS_PER_NODE: '4(2)' },
      message: /SLURM_TASKS_PER_NODE .*'4\(2\)'/,
    },
    {
      name: 'SLURM tasks per node missing',
      env: { ...SLURM, SLURM_TASKS_PER_NODE: '' },
      message: /SLURM_TASKS_PER_NODE is set/,
    },
    {
      name: 'SLURM_NODEID past the nodes',
      env: { ...SLURM, SLURM_NODEID: '2' },
      message: /SLURM_NODEID .*'2'/,
    },
    {
      name: 'SLURM_NODEID missing with uneven nodes',
      env: { ...SLURM, SLURM_NODEID: '' },
      message: /SLURM_NODEID is not set/,
    },
    {
      name: 'SLURM_JOB_NODELIST with an open bracket',
      env: { ...SLURM, SLURM_JOB_NODELIST: 'gpu[07-08' },
      message: /SLURM_JOB_NODELIST .*'gpu\[07-08'/,
    },
    {
      name: 'SLURM_JOB_NODELIST with a decreasing range',
      env: { ...SLURM, SLURM_JOB_NODELIST: 'gpu[08-07]' },
      message: /SLURM_JOB_NODELIST .*'gpu\[08-07\]'/,
    },
    {
      name: 'SLURM_JOB_NODELIST bad in a later entry',
      env: { ...SLURM, SLURM_JOB_NODELIST: 'gpu[07-08],cpu[a]' },
      message: /SLURM_JOB_NODELIST .*'gpu\[07-08\],cpu\[a\]'/,
    },
    {
      name: 'no node list and no MASTER_ADDR',
      env: { ...SLURM, SLURM_JOB_NODELIST: '' },
      message: /SLURM_NODELIST is not set .*MASTER_ADDR/,
    },
    { name: 'SLURM_JOB_ID malformed', env: { ...SLURM, SLURM_JOB_ID: 'j1' }, message: /SLURM_JOB_ID .*'j1'/ },
    {
      name: 'SLURM_JOB_ID missing without MASTER_PORT',
      env: { ...SLURM, SLURM_JOB_ID: '' },
      message: /SLURM_JOB_ID is not set/,
    },
    {
      name: 'MPI without MASTER_ADDR',
      env: { ...MPI, MASTER_ADDR: '' },
      message: /MASTER_ADDR is not set .*mpirun -x MASTER_ADDR/,
    },
    {
      name: 'MPI without MASTER_PORT',
      env: { ...MPI, MASTER_PORT: '' },
      message: /MASTER_PORT is not set .*mpirun -x/,
    },
    {
      name: 'OMPI_COMM_WORLD_RANK outside the world',
      env: { ...MPI, OMPI_COMM_WORLD_RANK: '9' },
      message: /OMPI_COMM_WORLD_SIZE=4 .*OMPI_COMM_WORLD_RANK .*'9'/,
    },
    {
      name: 'OMPI_COMM_WORLD_LOCAL_SIZE malformed',
      env: { ...MPI, OMPI_COMM_WORLD_LOCAL_SIZE: 'two' },
      message: /OMPI_COMM_WORLD_LOCAL_SIZE .*'two'/,
    },
    {
      name: 'alone, with a malformed MASTER_PORT',
      env: { MASTER_PORT: '99999' },
      message: /between 0 and 65535 for the environment variable MASTER_PORT .*'99999'/,
    },
  ];

  it.each(BAD)('rejects $name', ({ env, message }) => {
    let caught: unknown;
    try {
      rendezvousFromEnv(env);
    } catch (error) {
      caught = error;
    }
    expect(caught).toMatchObject({ code: 'ERR_RC_INVALID_ARGUMENT' });
    expect((caught as Error).message).toMatch(message);
  });
});

describe('SLURM forms', () => {
  it.each([
    ['node01', ['node01']],
    ['node[01-03,07]', ['node01', 'node02', 'node03', 'node07']],
    ['a[8-10],b', ['a8', 'a9', 'a10', 'b']],
    ['r[1-2]-n[9-10]', ['r1-n9', 'r1-n10', 'r2-n9', 'r2-n10']],
    ['x[007],y[1,3]', ['x007', 'y1', 'y3']],
  ])('expands the host list %s', (list, hosts) => {
    expect(expandSlurmHostList('SLURM_JOB_NODELIST', list)).toEqual(hosts);
  });

  it('returns only the first hosts when asked, still checking the whole list', () => {
    expect(expandSlurmHostList('L', 'n[1-100000]', 2)).toEqual(['n1', 'n2']);
    expect(() => expandSlurmHostList('L', 'n[1-3],,m', 1)).toThrow(/L .*'n\[1-3\],,m'/);
  });

  it.each([
    ['4', [4]],
    ['4(x2)', [4, 4]],
    ['2(x3),1', [2, 2, 2, 1]],
  ])('expands the tasks per node %s', (form, counts) => {
    expect(expandSlurmTasksPerNode('SLURM_TASKS_PER_NODE', form)).toEqual(counts);
  });

  it('derives the port from the job id inside 10000-29999', () => {
    expect(slurmDefaultPort(0)).toBe(10000);
    expect(slurmDefaultPort(19999)).toBe(29999);
    expect(slurmDefaultPort(20000)).toBe(10000);
  });
});
