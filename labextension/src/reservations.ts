/**
 * The admin's reservations as each user meets them: a member sees their room on the launcher and in
 * the status bar while it is kept for them; everyone sees what is reserved and when in the panel (and
 * others in the launcher's tooltips); a kernel that borrowed reserved room, or is warned to give it
 * back, is told for which reservation. Calm: nothing here is a notification. Pure functions; the
 * words are the catalogue's (words.ts).
 */

import { formatWhen } from './format';
import { __ } from './i18n';
import type { IKernel, IMe, IPool, IReservation } from './types';
import { amountWords, phaseWord, reservationNow } from './words';

/** The phases in which a reservation keeps its room from non-members (its lead time, its window). */
const KEEPING = ['making_room', 'open'];

/** The reservations of `me` that are not over, members' first, then by start. */
export function shownReservations(me: IMe | null): IReservation[] {
  return [...(me?.reservations ?? [])]
    .filter(r => r.phase !== 'after')
    .sort((a, b) => Number(b.member) - Number(a.member) || a.start - b.start);
}

/** The member's reservations keeping room for them now (from their lead time to their end). */
export function keptForMe(me: IMe | null): IReservation[] {
  return shownReservations(me).filter(r => r.member && KEEPING.includes(r.phase));
}

/**
 * The reservation the server's words about a kernel concern (its `borrowed`, its warning's message):
 * of those the user is not a member of and that keep room now (`phases`), the one the words name
 * ("reserved for ML 101 lab …", the longest name where one contains another), else the only one.
 */
export function reservationNamed(
  text: string | null | undefined,
  reservations: ReadonlyArray<IReservation> | undefined,
  phases: ReadonlyArray<string> = KEEPING
): IReservation | null {
  const others = (reservations ?? []).filter(r => !r.member && phases.includes(r.phase));
  const named = others
    .filter(r => !!text && text.includes(`reserved for ${r.name}`))
    .sort((a, b) => b.name.length - a.name.length);
  return named[0] ?? (others.length === 1 ? others[0] : null);
}

/**
 * The reservation a kernel's warning gives its room back for (reason `reserved`), or null: the one its
 * `reservation` names, else (a server that does not say) the one its message names.
 */
export function warnedFor(
  kernel: IKernel,
  reservations: ReadonlyArray<IReservation> | undefined
): IReservation | null {
  const w = kernel.warning;
  if (!w || w.reason !== 'reserved') {
    return null;
  }
  if (w.reservation) {
    return (reservations ?? []).find(r => r.name === w.reservation) ?? null;
  }
  return reservationNamed(w.message, reservations);
}

/**
 * Whether a kernel runs on room borrowed from a reservation now: it holds its slice (a hibernated
 * kernel gave the room back, whatever its lease remembers) and the server says it borrowed.
 */
export function onBorrowedRoom(kernel: IKernel): boolean {
  return !!kernel.borrowed && kernel.state === 'active';
}

/** The reservation whose room a kernel borrowed (while its window is open), or null. */
export function borrowedFrom(
  kernel: IKernel,
  reservations: ReadonlyArray<IReservation> | undefined
): IReservation | null {
  return kernel.borrowed ? reservationNamed(kernel.borrowed, reservations, ['open']) : null;
}

/* ---- the admin's dashboard ------------------------------------------------------------------ */

/** A reservation as the dashboard lists it. */
export interface IReservationRow {
  key: string;
  name: string;
  /** Its groups and users: "group ml101, teacher". */
  who: string;
  /** Its window as the admin wrote it ("Tue, Thu 10:00-12:00 (Europe/Paris)"). */
  window: string;
  /** What it keeps, and on which GPU models: "160 GiB on *H100*". */
  room: string;
  phase: string;
  /** Where it stands now, and what comes next. */
  now: string;
}

export function reservationRows(pool: IPool, now: number): IReservationRow[] {
  return [...(pool.reservations ?? [])]
    .sort((a, b) => a.start - b.start)
    .map(r => {
      const amount = amountWords(r.memory, r.gpus);
      return {
        key: `${r.name}-${r.start}`,
        name: r.name,
        who: [...r.groups.map(g => __('group %1', g)), ...r.users].join(', ') || '–',
        window: r.window,
        room: r.models.length ? __('%1 on %2', amount, r.models.join(', ')) : amount,
        phase: phaseWord(r.phase),
        now: reservationNow(r, now)
      };
    });
}

/** A reservation drawn on a GPU's plots: the room kept from `from` (its lead time), open from `open`. */
export interface IReservationBand {
  name: string;
  from: number;
  open: number;
  to: number;
  /** What the legend says of it. */
  label: string;
}

/** Whether a GPU's name matches one of a reservation's models (glob patterns, as the server reads them). */
export function onModels(gpuName: string, models: ReadonlyArray<string>): boolean {
  if (!models.length) {
    return true;
  }
  const name = gpuName.toLowerCase();
  return models.some(pattern => {
    const re = pattern
      .toLowerCase()
      .replace(/[.+^${}()|\\]/g, '\\$&')
      .replace(/\*/g, '.*')
      .replace(/\?/g, '.');
    return new RegExp(`^${re}$`).test(name);
  });
}

/**
 * Per GPU (by uuid), the reservations keeping room on it that the GPU timeline draws: from their lead
 * time to their end, on the GPUs of their models. The plot shows what falls within its window.
 */
export function reservationBands(pool: IPool, now: number): Map<string, IReservationBand[]> {
  const bands = new Map<string, IReservationBand[]>();
  for (const r of pool.reservations ?? []) {
    const from = r.start - (r.lead ?? 0);
    const band = {
      name: r.name,
      from,
      open: r.start,
      to: r.end,
      label: __(
        '%1: %2 reserved from %3 to %4 (its room made from %5)',
        r.name,
        amountWords(r.memory, r.gpus),
        formatWhen(r.start, now),
        formatWhen(r.end, r.start),
        formatWhen(from, now)
      )
    };
    for (const g of pool.gpus.filter(g => onModels(g.name, r.models))) {
      bands.set(g.uuid, [...(bands.get(g.uuid) ?? []), band]);
    }
  }
  return bands;
}
