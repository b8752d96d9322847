/**
 * Class time in JupyterLab: a member sees their reservation in the status bar, on the launcher and in
 * the panel; others see what is reserved and when (the panel, the launcher's tooltips), calmly; a kernel
 * on borrowed room is told so on its card; a queued kernel shows why it is where it is; the dashboard
 * lists the reservations and draws them on the GPU timeline.
 */
import assert from 'node:assert/strict';
import * as React from 'react';
import { act } from 'react';
import { createRoot, Root } from 'react-dom/client';

import { dashboardView } from '../admin';
import { MyKernels } from '../components';
import { Dashboard } from '../dashboard';
import { annotateLauncher } from '../launcher';
import {
  borrowedFrom,
  keptForMe,
  onModels,
  reservationBands,
  reservationNamed,
  warnedFor
} from '../reservations';
import type { IPoolReservation, IReservation } from '../types';
import { cardView, indicatorView, statusView } from '../view';
import { GiB, kernel, me, NOW, pool, profiles, warning } from './fixtures';

(globalThis as any).IS_REACT_ACT_ENVIRONMENT = true;

/** 10:00 UTC on NOW's day (NOW is 10:06:40): the windows below open then. */
const TEN = NOW - 400;

function reservation(overrides: Partial<IReservation> = {}): IReservation {
  return {
    name: 'ML 101 lab',
    phase: 'open',
    start: TEN,
    end: TEN + 7200,
    member: true,
    memory: 160 * GiB,
    gpus: null,
    models: [],
    lead: 600,
    borrowing: false,
    ...overrides
  };
}

/** Research block: someone else's, open 10:00-16:00, borrowing allowed. */
const research = reservation({
  name: 'Research block',
  member: false,
  memory: 40 * GiB,
  end: TEN + 6 * 3600,
  borrowing: true
});

const BORROWED =
  'Borrowed from the room reserved for Research block until 16:00: it may be hibernated (its variables kept), with a warning, when a member needs the room.';

describe('which reservation a kernel’s words concern', () => {
  it('is the one the server’s words name, the longest name first, else the only one', () => {
    const lab = reservation({ member: false });
    const labs = reservation({ name: 'ML 101 lab B', member: false });
    assert.equal(reservationNamed('reserved for ML 101 lab B until 12:00', [lab, labs]), labs);
    assert.equal(reservationNamed('reserved for ML 101 lab until 12:00', [lab, labs]), lab);
    assert.equal(reservationNamed('no name here', [lab]), lab);
    assert.equal(reservationNamed('no name here', [lab, labs]), null);
    // never one of the user's own, nor one that keeps no room now
    assert.equal(reservationNamed('reserved for ML 101 lab', [reservation()]), null);
    assert.equal(
      reservationNamed('reserved for ML 101 lab', [
        reservation({ member: false, phase: 'before' })
      ]),
      null
    );
  });

  it('reads a borrowed kernel’s and a warned kernel’s reservation from GET me', () => {
    const k = kernel({
      borrowed: BORROWED,
      warning: {
        ...warning,
        reason: 'reserved',
        message:
          'The GPU room this kernel holds is reserved for Research block until 16:00, and a member needs it: …'
      }
    });
    assert.equal(borrowedFrom(k, [reservation(), research])?.name, 'Research block');
    assert.equal(warnedFor(k, [reservation(), research])?.name, 'Research block');
    assert.equal(warnedFor(kernel({ warning }), [research]), null); // an idle warning is no reservation's
  });

  it('takes a reserved warning’s reservation from its field, by name, whatever its message says', () => {
    const labB = reservation({ name: 'ML 101 lab B' });
    const named = (
      name: string,
      message = 'The GPU room this kernel holds is reserved for others: …'
    ) => kernel({ warning: { ...warning, reason: 'reserved', message, reservation: name } });
    // the field decides where the message (a name that begins another's) would be read otherwise
    assert.equal(warnedFor(named('ML 101 lab'), [labB, reservation()])?.name, 'ML 101 lab');
    assert.equal(
      warnedFor(
        named(
          'ML 101 lab',
          'The GPU room this kernel holds is reserved for ML 101 lab B until 12:00'
        ),
        [labB, reservation()]
      )?.name,
      'ML 101 lab'
    );
    assert.equal(warnedFor(named('Gone'), [labB]), null); // a reservation no longer shown
  });
});

describe('the status bar', () => {
  it('says a member’s reservation while it keeps their room, as the issue writes it', () => {
    const v = statusView(me({ reservations: [reservation()] }), null, NOW);
    assert.equal(v.text, 'GPU mem: 10 / 40 GiB · 37% · ML 101 lab: 160 GiB reserved until 12:00');
    // a window under 1200 px: JupyterLab's own items keep their room, the tooltip says it
    assert.equal(v.short, 'GPU mem: 10 / 40 GiB · 37%');
    assert.match(
      v.title,
      /^ML 101 lab: 160 GiB reserved for you and your group until 12:00; you go first\.$/m
    );
    assert.equal(v.level, 'ok'); // calm: no colour for a reservation
  });

  it('leaves a reservation days ahead, and others’ reservations, to the tooltip', () => {
    const later = reservation({ phase: 'before', start: TEN + 86400, end: TEN + 86400 + 7200 });
    const v = statusView(me({ reservations: [later, research] }), null, NOW);
    assert.equal(v.text, 'GPU mem: 10 / 40 GiB · 37%');
    assert.match(
      v.title,
      /^ML 101 lab: 160 GiB reserved for you and your group from Nov 23 10:00 to 12:00\.$/m
    );
    assert.match(
      v.title,
      /^The pool keeps 40 GiB for Research block until 16:00; you may borrow what its members leave unused, until one of them needs it\.$/m
    );
    assert.deepEqual(keptForMe(me({ reservations: [later, research] })), []);
  });

  it('tells which kernel runs on borrowed room, and why a queued one waits where it is', () => {
    const why =
      "3rd in the queue: group 'research' has used more than its share lately (2.4x); 2 ahead are from groups under their share";
    const state = me({
      reservations: [research],
      kernels: [
        kernel({ name: 'borrow.ipynb', borrowed: BORROWED }),
        kernel({ kernel_id: 'q1', name: 'wait.ipynb', state: 'queued', queue_position: 3 })
      ],
      queue: [{ position: 3, kernel_id: 'q1', profile: 'gpu-10g', for: 'start', why }]
    });
    const lines = statusView(state, null, NOW).title.split('\n');
    assert.ok(
      lines.includes(
        'borrow.ipynb runs on room borrowed from Research block until 16:00: it may be hibernated, its variables kept, when a member needs it.'
      ),
      lines.join('\n')
    );
    const at = lines.indexOf('wait.ipynb: queued at position 3.');
    assert.equal(lines[at + 1], `${why.charAt(0).toUpperCase()}${why.slice(1)}.`);
  });
});

describe('a kernel’s card and toolbar', () => {
  it('says a kernel runs on borrowed room, and which reservation it may be taken back for', () => {
    const state = me({ reservations: [research] });
    const v = cardView(kernel({ borrowed: BORROWED }), NOW, false, state);
    assert.equal(
      v.borrowed,
      'Borrowed from the room reserved for Research block until 16:00: it may be hibernated, its variables kept, with a warning when a member needs the room.'
    );
    assert.equal(cardView(kernel(), NOW, false, state).borrowed, '');
    // hibernated, it gave the room back, whatever its lease remembers
    const asleep = kernel({ borrowed: BORROWED, state: 'hibernated', gpus: [] });
    assert.equal(cardView(asleep, NOW, false, state).borrowed, '');
    assert.doesNotMatch(statusView({ ...state, kernels: [asleep] }, null, NOW).title, /borrowed/);
    assert.match(
      indicatorView({ ...state, kernels: [kernel({ borrowed: BORROWED })] }, kernel().kernel_id)
        .title,
      /Borrowed from the room reserved for Research block/
    );
  });

  it('warns of the reclaim with the reservation’s reason and no Keep alive, however many snoozes are left', () => {
    const k = kernel({
      borrowed: BORROWED,
      warning: {
        ...warning,
        action: 'hibernate',
        reason: 'reserved',
        snoozes_left: 2,
        message:
          'The GPU room this kernel holds is reserved for Research block until 16:00, and a member needs it: …'
      },
      actions: ['snooze', 'release', 'shutdown']
    });
    const v = cardView(k, NOW, false, me({ reservations: [research] }));
    assert.equal(
      v.countdown!.message,
      'Its GPU room is reserved for Research block until 16:00, and a member needs it: it gives its GPU slice back at that time and keeps its variables. Running a cell does not keep the room.'
    );
    assert.deepEqual(
      v.actions.map(a => a.label),
      ['Release GPU', 'Shut down']
    );
  });

  it('shows why a queued kernel is where it is, where the server says', () => {
    const why = '1st in the queue: going first into the room reserved for ML 101 lab';
    const queued = kernel({ state: 'queued', queue_position: 1, gpus: [] });
    const state = me({
      queue: [{ position: 1, kernel_id: queued.kernel_id, profile: 'gpu-10g', for: 'resume', why }]
    });
    assert.equal(
      cardView(queued, NOW, false, state).queueWhy,
      '1st in the queue: going first into the room reserved for ML 101 lab.'
    );
    assert.match(
      indicatorView({ ...state, kernels: [queued] }, queued.kernel_id).title,
      /^1st in the queue: going first/m
    );
    const fifo = me({
      queue: [
        { position: 1, kernel_id: queued.kernel_id, profile: 'gpu-10g', for: 'resume', why: null }
      ]
    });
    assert.equal(cardView(queued, NOW, false, fifo).queueWhy, '');
  });
});

/** A launcher as JupyterLab renders it: a Notebook section with its cards. */
function launcher(labels: string[]): HTMLElement {
  const root = document.createElement('div');
  root.className = 'jp-Launcher';
  const cards = labels
    .map(
      label =>
        `<div class="jp-LauncherCard" title="${label}"><div class="jp-LauncherCard-label" title="${label}"><p>${label}</p></div></div>`
    )
    .join('');
  root.innerHTML = `<div class="jp-Launcher-section"><div class="jp-Launcher-sectionHeader"><h2 class="jp-Launcher-sectionTitle">Notebook</h2></div><div class="jp-Launcher-cardContainer">${cards}</div></div>`;
  return root;
}

describe('the launcher', () => {
  it('shows a member their reservation above the GPU kernels, kept up to date, gone with it', () => {
    const root = launcher(['Python 3 (ipykernel)', 'Python 3 · GPU 10 GiB']);
    const state = me({ profiles: profiles({}), reservations: [reservation(), research] });
    annotateLauncher(root, state);
    annotateLauncher(root, state);
    const notes = root.querySelectorAll('.jp-GpuPool-launcherReservation');
    assert.equal(notes.length, 1);
    assert.equal(notes[0].textContent, 'ML 101 lab: 160 GiB reserved until 12:00');
    assert.equal(notes[0].nextElementSibling?.className, 'jp-Launcher-cardContainer');
    annotateLauncher(root, { ...state, reservations: [reservation({ end: TEN + 3600 })] });
    assert.equal(
      root.querySelector('.jp-GpuPool-launcherReservation')!.textContent,
      'ML 101 lab: 160 GiB reserved until 11:00'
    );
    annotateLauncher(root, { ...state, reservations: [research] });
    assert.equal(root.querySelector('.jp-GpuPool-launcherReservation'), null);
  });

  it('tells others what is reserved and when in the GPU cards’ tooltips, not on the page', () => {
    const root = launcher(['Python 3 (ipykernel)', 'Python 3 · GPU 10 GiB']);
    annotateLauncher(
      root,
      me({ profiles: profiles({ 'gpu-10g': true }), reservations: [research] })
    );
    const [plain, gpu] = Array.from(root.querySelectorAll<HTMLElement>('.jp-LauncherCard'));
    assert.equal(plain.title, 'Python 3 (ipykernel)');
    assert.match(
      gpu.title,
      /\nThe pool keeps 40 GiB for Research block until 16:00; you may borrow what its members leave unused, until one of them needs it\.$/
    );
    assert.equal(root.querySelector('.jp-GpuPool-launcherReservation'), null);
  });
});

let host: HTMLDivElement;
let root: Root;

beforeEach(() => {
  host = document.createElement('div');
  document.body.appendChild(host);
  root = createRoot(host);
});

afterEach(() => {
  act(() => root.unmount());
  host.remove();
});

describe('the panel', () => {
  it('lists the reservations, the member’s first and marked for them, and a borrowed kernel’s card says so', () => {
    const actions = { run: async () => undefined, open: () => undefined, waiting: () => false };
    const state = me({
      reservations: [research, reservation()],
      kernels: [kernel({ borrowed: BORROWED })]
    });
    act(() => root.render(<MyKernels me={state} now={NOW} actions={actions} />));
    const items = Array.from(host.querySelectorAll('.jp-GpuPool-reservation')).map(
      li => li.textContent
    );
    assert.deepEqual(items, [
      'ML 101 lab: 160 GiB reserved until 12:00open, for you',
      '40 GiB reserved for Research block until 16:00open'
    ]);
    assert.equal(
      host.querySelector('.jp-GpuPool-reservations h2')!.textContent,
      'Reserved GPU room'
    );
    assert.match(
      host.querySelector('.jp-GpuPool-borrowed')!.textContent!,
      /^Borrowed from the room reserved for Research block until 16:00/
    );
    assert.equal(host.querySelectorAll('[role="alert"]').length, 0);
  });

  it('has no reservation section where there is none', () => {
    const actions = { run: async () => undefined, open: () => undefined, waiting: () => false };
    act(() => root.render(<MyKernels me={me()} now={NOW} actions={actions} />));
    assert.equal(host.querySelector('.jp-GpuPool-reservations'), null);
  });
});

function listed(overrides: Partial<IPoolReservation> = {}): IPoolReservation {
  return {
    ...reservation({ member: false }),
    groups: ['ml101'],
    users: ['teacher'],
    window: 'Fri 10:00-12:00 (UTC)',
    ...overrides
  };
}

describe('the dashboard', () => {
  it('lists every reservation: for whom, its window as written, its room and where it stands', () => {
    const p = pool({
      reservations: [
        listed({
          phase: 'making_room',
          start: NOW + 300,
          end: NOW + 3900,
          name: 'Exam',
          models: ['*A100*'],
          gpus: 1,
          memory: null,
          groups: [],
          users: ['eve']
        }),
        listed()
      ]
    });
    const rows = dashboardView(p, NOW).reservations;
    assert.deepEqual(
      rows.map(r => [r.name, r.who, r.window, r.room, r.phase, r.now]),
      [
        [
          'ML 101 lab',
          'group ml101, teacher',
          'Fri 10:00-12:00 (UTC)',
          '160 GiB',
          'open',
          'open until 12:00: members first; others may borrow from 10:10'
        ],
        [
          'Exam',
          'eve',
          'Fri 10:00-12:00 (UTC)',
          '1 GPU on *A100*',
          'making room',
          'making room: the kernels of non-members give it back; opens at 10:11'
        ]
      ]
    );
  });

  it('draws each reservation on the GPUs of its models, from its lead time to its end', () => {
    const p = pool({
      gpus: [
        { ...pool().gpus[0], uuid: 'A', name: 'NVIDIA A100-SXM4-80GB' },
        { ...pool().gpus[0], uuid: 'H', name: 'NVIDIA H100 80GB HBM3' }
      ],
      reservations: [listed({ models: ['*h100*'] }), listed({ name: 'Any GPU', models: [] })]
    });
    const bands = reservationBands(p, NOW);
    assert.deepEqual(
      bands.get('A')!.map(b => b.name),
      ['Any GPU']
    );
    assert.deepEqual(
      bands.get('H')!.map(b => [b.name, b.from, b.open, b.to]),
      [
        ['ML 101 lab', TEN - 600, TEN, TEN + 7200],
        ['Any GPU', TEN - 600, TEN, TEN + 7200]
      ]
    );
    assert.equal(
      bands.get('H')![0].label,
      'ML 101 lab: 160 GiB reserved from 10:00 to 12:00 (its room made from 09:50)'
    );
    assert.ok(onModels('NVIDIA H100', ['*H100*']) && !onModels('NVIDIA H100', ['A100']));
    assert.ok(onModels('Tesla V100 (x)', ['tesla v100 (?)']));
  });

  it('says which leases borrowed reserved room and why each waiter is where it is', () => {
    const base = pool();
    const p = pool({
      leases: [
        { ...base.leases[0], borrowed: ['Research block'] },
        base.leases[1],
        { ...base.leases[2], borrowed: ['Research block'] } // hibernated: the room is given back
      ],
      queue: [
        {
          ...base.queue[1],
          why: '1st in the queue: going first into the room reserved for ML 101 lab'
        }
      ]
    });
    const view = dashboardView(p, NOW);
    assert.deepEqual(
      view.leases.map(l => [l.owner, l.state, l.borrowed]),
      [
        ['alice', 'active', ''],
        ['bob', 'hibernated', ''], // the older first
        ['bob', 'active', 'borrowed from Research block']
      ]
    );
    assert.equal(
      view.queue[0].why,
      '1st in the queue: going first into the room reserved for ML 101 lab'
    );
  });

  it('renders the reservation table on the GPUs tab', () => {
    const p = pool({ reservations: [listed({ start: NOW - 60, end: NOW + 3600 })] });
    const actions = { act: async () => undefined, open: () => undefined, request: () => null };
    act(() =>
      root.render(
        <Dashboard
          pool={p}
          telemetry={null}
          error={null}
          telemetryError={null}
          now={NOW}
          actions={actions}
        />
      )
    );
    const row = host.querySelector('tr[data-reservation="ML 101 lab"]')!;
    assert.equal(row.querySelector('th')!.textContent, 'ML 101 lab');
    assert.match(row.textContent!, /open until 11:06: members first/);
  });
});
