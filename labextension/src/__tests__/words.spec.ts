/**
 * Every sentence the extension writes, in every combination of reason, action, kind and state the
 * catalogue knows (and an unknown one of each), reads right: a capital start and a final stop, no
 * word doubled, no clause glued where a phrase was meant ("because it was someone is waiting…"),
 * nothing left unfilled, brackets and quotes paired, within a toast's 140 characters where it is a
 * toast. Not one example each: all of them, so that a reason added to the catalogue is checked in
 * every sentence it can appear in.
 */
import assert from 'node:assert/strict';

import { decisionRow } from '../admin';
import { NoticeBook } from '../facts';
import { explanation, recordLine, refusalAdvice, TOAST_LIMIT, warningMessage } from '../notices';
import { IAdminRequest, requestText } from '../requests';
import type { IKernel, IRecent } from '../types';
import {
  actionViews,
  cardView,
  HISTORY_KINDS,
  historyLine,
  stateView,
  statusView,
  warningConsequence
} from '../view';
import { reservationBands, reservationRows } from '../reservations';
import type { IReservation } from '../types';
import {
  amountWords,
  borrowedLine,
  borrowedWords,
  KNOWN_REASONS,
  kindWord,
  phaseWord,
  reasonWords,
  reservationNow,
  reservationSentence,
  reservationWords,
  reservedFor,
  stateWord
} from '../words';
import { GiB, kernel, me, NOW, pool, profiles, Screen, warning } from './fixtures';

const REASONS: Array<string | undefined> = [...KNOWN_REASONS, undefined, 'novel_reason'];
const KINDS = [...HISTORY_KINDS, 'warned', 'snoozed', 'novel_kind'];
const ACTIONS: Array<string | undefined> = [
  undefined,
  'resume',
  'first_cell',
  'hibernate',
  'shutdown'
];
const STATES = [
  'active',
  'hibernating',
  'hibernated',
  'no_gpu_yet',
  'resuming',
  'queued',
  'stopping',
  'released',
  'novel_state'
];
const NAMES = ['Untitled.ipynb', 'results/A-very-long-notebook-name-for-week-twelve.ipynb', ''];

/** Reservations in every phase, member or not, each kind of room, windows today and days away. */
function reservations(): IReservation[] {
  const found: IReservation[] = [];
  for (const phase of ['before', 'making_room', 'open', 'after', 'novel_phase']) {
    for (const member of [false, true]) {
      for (const [memory, gpus] of [
        [160 * GiB, null],
        [null, 1],
        [null, 2],
        [40 * GiB, 2],
        [null, null]
      ]) {
        for (const name of ['ML 101 lab', 'Advanced Deep Learning for Biology, Tuesday group B']) {
          for (const [start, end] of [
            [NOW - 400, NOW + 6800],
            [NOW + 3 * 86400, NOW + 3 * 86400 + 7200],
            [NOW - 3600, NOW + 86400]
          ]) {
            for (const borrowing of [false, true]) {
              found.push({
                name,
                phase,
                member,
                memory,
                gpus,
                models: [],
                start,
                end,
                lead: 600,
                borrowing
              });
            }
          }
        }
      }
    }
  }
  return found;
}

/** Words that start a clause: what may follow "because". */
const SUBJECT = /^(it|its|someone|you|your|an|the|no|every|host|a)\b/;

/** Faults of a piece of text wherever it appears (a sentence, or a fragment on a card). */
function faults(text: string): string[] {
  const found: string[] = [];
  const check = (bad: boolean, what: string) => bad && found.push(what);
  check(/undefined|null|NaN|\[object|%\d/.test(text), 'something left unfilled');
  check(/\s{2,}/.test(text), 'a double space');
  check(/\s[.,;:)]/.test(text) || /\(\s/.test(text), 'a space before punctuation');
  check(/\(\)|\.\.(?!\.)|[,;:]\./.test(text), 'empty brackets or doubled punctuation');
  const doubled = text.match(/\b(\w+)\s+\1\b/i);
  check(!!doubled && !/^\d+$/.test(doubled[1]), `the word "${doubled?.[1]}" doubled`);
  for (const m of text.matchAll(/\bbecause (\S+)/g)) {
    check(!SUBJECT.test(m[1]), `"because" before "${m[1]}", not a clause`);
  }
  check(
    /because it was (someone|no|every|your|an|the|a|its|you|host)\b/.test(text),
    'a clause glued into a clause'
  );
  const count = (c: string) => text.split(c).length - 1;
  check(count('(') !== count(')'), 'brackets unpaired');
  check(count('‘') !== count('’') - count('’s') - count('n’t'), 'quotes unpaired');
  check(count('“') !== count('”'), 'double quotes unpaired');
  return found;
}

/** A whole sentence (or several): a capital first letter, a final stop, and each fault-free. */
function sentenceFaults(text: string): string[] {
  const found = faults(text);
  if (!/^[A-Z‘“]/.test(text)) {
    found.push('no capital start');
  }
  if (!/[.!?…]$/.test(text)) {
    found.push('no final stop');
  }
  // The next sentence starts with a capital too (not a file name's dot: "a.ipynb").
  const next = text.match(/[.!?] ([a-z]\w*)/);
  if (next) {
    found.push(`a sentence starting "${next[1]}"`);
  }
  return found;
}

class Rendered {
  checked = 0;
  bad = new Set<string>();

  sentence(where: string, text: string, toast = false): void {
    this.checked++;
    const found = sentenceFaults(text);
    if (toast && text.length > TOAST_LIMIT) {
      found.push(`${text.length} characters`);
    }
    if (found.length) {
      this.bad.add(`${where}: ${found.join(', ')}: «${text}»`);
    }
  }

  fragment(where: string, text: string): void {
    this.checked++;
    const found = faults(text);
    if (found.length) {
      this.bad.add(`${where}: ${found.join(', ')}: «${text}»`);
    }
  }

  assertAllRead(min: number): void {
    assert.ok(this.checked >= min, `only ${this.checked} texts rendered`);
    assert.deepEqual(
      [...this.bad].slice(0, 20),
      [],
      `${this.bad.size} distinct texts of ${this.checked} read wrong`
    );
  }
}

function recent(kind: string, reason: string | undefined, fields: Partial<IRecent> = {}): IRecent {
  return { at: NOW, kind, kernel_id: 'k', name: 'Untitled.ipynb', reason, message: '', ...fields };
}

describe('the catalogue of words', () => {
  it('has both forms of every reason, and a readable one for a reason it does not know', () => {
    for (const reason of REASONS) {
      const words = reasonWords(reason);
      assert.ok(words.tag && words.because, String(reason));
      assert.match(words.because, SUBJECT, `${reason}: "because ${words.because}"`);
      assert.doesNotMatch(words.tag, /^[A-Z][a-z]/, `${reason}: a tag goes within a sentence`);
    }
    assert.equal(reasonWords('pressure').because, 'someone was waiting for a GPU slice');
    assert.match(stateWord('novel_state'), /novel_state/);
    assert.match(kindWord('novel_kind'), /novel kind/);
  });

  it('writes every line of What happened as a sentence that reads right', () => {
    const r = new Rendered();
    for (const kind of KINDS) {
      for (const reason of REASONS) {
        for (const action of ACTIONS) {
          for (const declared of [false, true]) {
            for (const with_server of [false, true]) {
              for (const note of [null, 'could not hibernate']) {
                for (const rule of [undefined, 'demo']) {
                  const line = historyLine(
                    recent(kind, reason, { action, declared, with_server, note, rule })
                  );
                  r.sentence(`history ${kind}/${reason}/${action}`, line);
                }
              }
            }
          }
        }
      }
    }
    r.assertAllRead(10_000);
    // The sentence of issue 28, read right now.
    assert.equal(
      historyLine(recent('hibernated', 'pressure')),
      'Hibernated because someone was waiting for a GPU slice; its variables are kept.'
    );
  });

  it('writes every toast and every record of the notification centre as sentences that read right', () => {
    const r = new Rendered();
    const state = me({ profiles: profiles({ 'gpu-10g': true }) });
    for (const kind of KINDS) {
      for (const reason of REASONS) {
        for (const action of ACTIONS) {
          for (const withServer of [false, true]) {
            for (const declared of [false, true]) {
              for (const name of NAMES) {
                const context = { me: state, profile: 'gpu-20g', action, withServer, declared };
                r.sentence(
                  `toast ${kind}/${reason}/${action}`,
                  explanation(kind, name || undefined, reason, '', context),
                  true
                );
                r.sentence(
                  `record ${kind}/${reason}/${action}`,
                  recordLine(kind, name || undefined, reason, '14:05', context),
                  true
                );
              }
            }
          }
        }
      }
    }
    r.assertAllRead(10_000);
  });

  it('writes every warning, its card line and the advice after a refusal as sentences that read right', () => {
    const r = new Rendered();
    for (const action of ['hibernate', 'shutdown'] as const) {
      for (const reason of REASONS) {
        for (const snoozes_left of [0, 2]) {
          for (const isolation of ['soft', 'mps']) {
            for (const name of NAMES) {
              for (const left of [30, 119, 600, 3 * 86400]) {
                const k = kernel({
                  name,
                  isolation,
                  idle_since: NOW - 1500,
                  warning: {
                    ...warning,
                    action,
                    reason: reason ?? '',
                    snoozes_left,
                    deadline: NOW + left
                  }
                });
                if (!cardView(k, NOW).countdown) {
                  continue; // a stale reason (view.staleReason): no warning shown at all
                }
                r.sentence(`warning ${action}/${reason}`, warningMessage(k, NOW), true);
                r.sentence(`consequence ${action}/${reason}`, warningConsequence(k));
                r.fragment(`countdown ${action}/${reason}`, cardView(k, NOW).countdown!.text);
              }
            }
          }
        }
      }
    }
    for (const reason of REASONS) {
      for (const room of [{}, { 'gpu-10g': true }, { 'gpu-10g': true, 'gpu-whole': true }] as Array<
        Record<string, boolean>
      >) {
        for (const held of [0, 1, 2]) {
          const state = me({
            profiles: profiles(room),
            quota: { memory: null, sm_percent: null, kernels: 2 },
            usage: { memory: 0, sm_percent: 0, kernels: held },
            pool: { enabled: true, note: '', gpus: held }
          });
          r.sentence(`advice ${reason}`, refusalAdvice(reason, state, 'gpu-20g'));
        }
      }
    }
    r.assertAllRead(2000);
  });

  it('writes every card state, next action and button in words that read right', () => {
    const r = new Rendered();
    for (const state of STATES) {
      for (const action of ['hibernate', 'shutdown'] as const) {
        for (const reason of REASONS) {
          for (const isolation of ['soft', 'mps']) {
            for (const extra of [
              {},
              { snoozed_until: NOW + 600 },
              { sleeps_after_cell: 30 },
              { woken_on_hint: true },
              { execution_state: 'busy' },
              { lease_id: null, queue_position: 2 }
            ] as Array<Partial<IKernel>>) {
              for (const waiting of [false, true]) {
                const k = kernel({
                  state: state as IKernel['state'],
                  isolation,
                  next_action: { action, reason: reason ?? '', at: NOW + 600 },
                  release_action: action,
                  hibernate_unavailable:
                    isolation === 'mps'
                      ? 'an MPS client cannot be checkpointed (CUDA error 801)'
                      : null,
                  actions: ['release', 'resume', 'shutdown'],
                  ...extra
                });
                const v = stateView(k, NOW, waiting);
                r.fragment(`state ${state}/${reason}`, v.label);
                if (v.detail) {
                  r.fragment(`detail ${state}/${action}/${reason}`, v.detail);
                }
                for (const a of actionViews(k)) {
                  r.fragment(`button ${a.action}`, a.title);
                  assert.doesNotMatch(a.title, /error \d+/, 'a driver’s error number in a tooltip');
                  if (a.confirm) {
                    r.sentence(`question ${a.action}`, a.confirm.body);
                  }
                }
              }
            }
          }
        }
      }
    }
    r.assertAllRead(10_000);
  });

  it('says what a shutdown of an idle kernel costs, on the card as in its warning', () => {
    const idle = (isolation: string) =>
      stateView(
        kernel({
          isolation,
          next_action: { action: 'shutdown', reason: 'idle', at: NOW + 600 }
        }),
        NOW
      ).detail;
    assert.match(
      idle('mps'),
      /^will be shut down at \d\d:\d\d if still idle \(it cannot hibernate\): its variables will be lost$/
    );
    assert.match(idle('soft'), /its variables will be lost$/);
  });

  it('writes the status bar’s tooltip, the dashboard’s reasons and an admin’s requests in words that read right', () => {
    const r = new Rendered();
    for (const reason of REASONS) {
      const k = kernel({
        warning: { ...warning, reason: reason ?? '' },
        state: 'queued',
        queue_position: 1
      });
      for (const line of statusView(me({ kernels: [k] }), null, NOW).title.split('\n')) {
        if (!line.startsWith('Pool:')) {
          r.sentence('status', line);
        }
      }
      r.fragment('decision reason', decisionRow(recent('culled', reason), 0).reason);
    }
    for (const action of ['release', 'hibernate', 'shutdown'] as const) {
      for (const elsewhere of [false, true]) {
        const request: IAdminRequest = {
          kernelId: 'k',
          who: 'bob’s b.ipynb',
          action,
          at: NOW,
          state: 'active',
          phase: '',
          elsewhere
        };
        r.sentence('request', requestText(request, { kind: 'pending' }));
        r.sentence(
          'refused',
          requestText(request, { kind: 'refused', message: 'Not hibernated: it is busy.' })
        );
        r.sentence(
          'refused',
          requestText(request, { kind: 'refused', message: 'it cannot hibernate' })
        );
      }
    }
    r.assertAllRead(60);
  });

  it('writes every reservation, and every warning and card of a kernel giving reserved room back, in words that read right', () => {
    const r = new Rendered();
    const all = reservations();
    for (const res of all) {
      r.fragment(`reservation ${res.phase}/${res.member}`, reservationWords(res, NOW));
      r.sentence(`reservation sentence ${res.phase}/${res.member}`, reservationSentence(res, NOW));
      r.fragment(`reserved for ${res.phase}`, reservedFor(res, NOW));
      r.fragment(`admin ${res.phase}`, reservationNow(res, NOW));
      r.fragment(`amount ${res.memory}/${res.gpus}`, amountWords(res.memory, res.gpus));
      r.fragment(`phase ${res.phase}`, phaseWord(res.phase));
      r.sentence('borrowed', borrowedWords(res, NOW));
      r.sentence('borrowed line', borrowedLine('Untitled.ipynb', res, NOW));
    }
    r.fragment('reserved for nobody known', reservedFor(null, NOW));
    r.sentence('borrowed nobody known', borrowedWords(null, NOW));
    r.sentence('borrowed line nobody known', borrowedLine('Kernel 0b6f5f0e', null, NOW));
    // A warning to give reserved room back, with the reservation it names (or none known), for every
    // kind of kernel, name and deadline: a toast within 140 characters, and its card's line.
    const named = all.filter(res => !res.member && ['making_room', 'open'].includes(res.phase));
    for (const res of [...named.slice(0, 40), null]) {
      for (const action of ['hibernate', 'shutdown'] as const) {
        for (const isolation of ['soft', 'mps']) {
          for (const name of NAMES) {
            for (const left of [30, 600, 3 * 86400]) {
              const k = kernel({
                name,
                isolation,
                warning: {
                  ...warning,
                  action,
                  reason: 'reserved',
                  deadline: NOW + left,
                  message: res
                    ? `The GPU room this kernel holds is reserved for ${res.name} …`
                    : '…'
                }
              });
              const list = res ? [res] : [];
              r.sentence(`reserved warning ${action}`, warningMessage(k, NOW, list), true);
              r.sentence(`reserved consequence ${action}`, warningConsequence(k, list, NOW));
              const state = me({ reservations: list, kernels: [{ ...k, borrowed: 'Borrowed …' }] });
              for (const line of statusView(state, null, NOW).title.split('\n')) {
                if (!line.startsWith('Pool:')) {
                  r.sentence('status with a reservation', line);
                }
              }
              r.sentence('card borrowed', cardView(state.kernels[0], NOW, false, state).borrowed);
            }
          }
        }
      }
    }
    // The dashboard: each reservation's row and its band on the GPU timeline.
    const listed = all.map(res => ({ ...res, groups: ['ml101'], users: ['teacher'], window: 'w' }));
    const p = pool({ reservations: listed });
    for (const row of reservationRows(p, NOW)) {
      r.fragment('dashboard room', row.room);
      r.fragment('dashboard now', row.now);
      r.fragment('dashboard who', row.who);
    }
    for (const band of reservationBands(p, NOW).get('GPU-1') ?? []) {
      r.fragment('band', band.label);
    }
    r.assertAllRead(8000);
    assert.equal(
      reservationWords({ ...all[0], member: true, phase: 'open' }, NOW),
      'ML 101 lab: 160 GiB reserved until 12:00'
    );
  });

  it('writes the notifications of a whole sequence as sentences', () => {
    const r = new Rendered();
    const book = new NoticeBook(NOW - 1);
    book.add('new_kernel', { kernelId: 'k2', replaces: 'k', name: 'Untitled.ipynb', at: NOW });
    book.fromState(
      me({
        now: NOW + 1,
        kernels: [],
        recent: KINDS.map((kind, i) =>
          recent(kind, 'idle', { at: NOW + i / 10, kernel_id: `k${i}` })
        )
      })
    );
    const facts = new Screen(book).look().all;
    for (const f of facts) {
      r.sentence(`fact ${f.key}`, f.nature === 'record' ? f.record! : f.message, true);
    }
    r.assertAllRead(8);
  });
});
