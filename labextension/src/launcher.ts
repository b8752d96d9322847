/**
 * The launcher's GPU kernel cards, explained: the admin's description of the
 * profile and what its slice means as the card's tooltip ("50%" is a share of
 * the GPU's compute, enforced by NVIDIA MPS), and "(demo)" where the pool's GPUs
 * are declared. (The GPU badge itself is the kernelspec's logo.)
 *
 * JupyterLab's launcher titles a kernel card with the kernelspec's display name
 * and offers no other hook, so the cards JupyterLab rendered are annotated in
 * place; they are recognised by that display name, the launcher name of a
 * profile in GET me.
 */

import type { CommandRegistry } from '@lumino/commands';
import type { Widget } from '@lumino/widgets';

import { __ } from './i18n';
import type { PoolModel } from './model';
import { shownReservations } from './reservations';
import type { IMe, IProfile } from './types';
import { reservationSentence, reservationWords } from './words';

/** Whether kernels of this profile can hibernate at all: NVIDIA MPS clients refuse a checkpoint. */
export function profileHibernates(profile: IProfile): boolean {
  return profile.isolation !== 'mps';
}

/** The launcher card's line for a profile that cannot hibernate. */
export function noHibernationNote(): string {
  return __('cannot hibernate');
}

/**
 * What a profile's slice means, in words; `reserved`: what the admin's reservations keep from the user
 * and when (sentences), so that a card that will not start says why before it is clicked.
 */
export function profileTooltip(
  profile: IProfile,
  declared: boolean,
  reserved: ReadonlyArray<string> = []
): string {
  const lines: string[] = [];
  if (profile.description) {
    lines.push(profile.description);
  }
  if (profile.whole) {
    lines.push(__('A whole GPU of its own.'));
  } else if (profile.sm_percent) {
    lines.push(
      __(
        'A slice of %1 of GPU memory and %2% of the GPU’s compute (its streaming multiprocessors), enforced by NVIDIA MPS.',
        profile.slice_label.split(' · ')[0],
        profile.sm_percent
      )
    );
  } else {
    lines.push(
      __('A slice of %1 of GPU memory; the GPU’s compute is shared.', profile.slice_label)
    );
  }
  if (!profileHibernates(profile)) {
    lines.push(
      __(
        'It cannot hibernate (NVIDIA MPS): an idle kernel of this kind is shut down and loses its variables. Save your work.'
      )
    );
  }
  if (declared) {
    lines.push(
      __(
        'Demo: the pool’s GPUs are declared, not real. The kernel holds no GPU memory and cannot run CUDA code.'
      )
    );
  }
  if (profile.starts_now === false) {
    lines.push(
      __(
        'It would not start right now (your quota, or no room in the pool): the GPU panel says why.'
      )
    );
  }
  lines.push(...reserved);
  return lines.join('\n');
}

/**
 * A member's reservations above the launcher's GPU kernels ("ML 101 lab: 160 GiB reserved until
 * 12:00"): one line in the section of the cards, kept up to date, gone with the reservation.
 */
function showReservations(root: HTMLElement, card: HTMLElement | null, me: IMe): void {
  const lines = shownReservations(me)
    .filter(r => r.member)
    .map(r => ({ words: reservationWords(r, me.now), title: reservationSentence(r, me.now) }));
  let note = root.querySelector<HTMLElement>('.jp-GpuPool-launcherReservation');
  if (!lines.length || !card) {
    note?.remove();
    return;
  }
  const section = card.closest('.jp-Launcher-section');
  const container = card.closest('.jp-Launcher-cardContainer');
  if (!note) {
    note = document.createElement('p');
    note.className = 'jp-GpuPool-launcherReservation';
  }
  if (section && container && note.nextElementSibling !== container) {
    section.insertBefore(note, container);
  }
  const text = lines.map(l => l.words).join(' · ');
  if (note.textContent !== text) {
    note.textContent = text;
  }
  note.title = lines.map(l => l.title).join('\n');
}

/** Annotate the GPU kernel cards under `root` (a launcher). */
export function annotateLauncher(root: HTMLElement, me: IMe | null): void {
  if (!me?.pool.enabled || !me.profiles?.length) {
    return;
  }
  const byName = new Map(me.profiles.map(p => [p.launcher_name, p]));
  const declared = !!me.pool.declared;
  const reserved = shownReservations(me)
    .filter(r => !r.member)
    .map(r => reservationSentence(r, me.now));
  let first: HTMLElement | null = null;
  for (const card of Array.from(root.querySelectorAll<HTMLElement>('.jp-LauncherCard'))) {
    const label = card.querySelector('.jp-LauncherCard-label p')?.textContent ?? '';
    const profile = byName.get(label);
    if (!profile) {
      continue;
    }
    first = first ?? card;
    const tooltip = profileTooltip(profile, declared, reserved);
    card.title = tooltip;
    card.querySelector('.jp-LauncherCard-label')?.setAttribute('title', tooltip);
    card.classList.add('jp-GpuPool-launcherCard');
    const labelBox = card.querySelector('.jp-LauncherCard-label');
    const demo = labelBox?.querySelector('.jp-GpuPool-launcherDemo');
    if (declared && labelBox && !demo) {
      const mark = document.createElement('span');
      mark.className = 'jp-GpuPool-launcherDemo';
      mark.textContent = __('(demo)');
      labelBox.appendChild(mark);
    } else if (!declared && demo) {
      demo.remove();
    }
    if (
      labelBox &&
      !profileHibernates(profile) &&
      !labelBox.querySelector('.jp-GpuPool-launcherNote')
    ) {
      const note = document.createElement('span');
      note.className = 'jp-GpuPool-launcherNote';
      note.textContent = noHibernationNote();
      labelBox.appendChild(note);
    }
  }
  showReservations(root, first, me);
}

/**
 * Keep every launcher annotated: each one JupyterLab's `launcher:create` command opens (at start
 * too, when the layout is restored), as its cards render, and when GET me changes.
 */
export function followLaunchers(commands: CommandRegistry, model: PoolModel): void {
  const launchers = new Set<HTMLElement>();
  commands.commandExecuted.connect((_, executed) => {
    if (executed.id !== 'launcher:create') {
      return;
    }
    void executed.result.then((widget: Widget) => {
      const node = widget.node;
      launchers.add(node);
      widget.disposed.connect(() => {
        launchers.delete(node);
        observer.disconnect();
      });
      const observer = new MutationObserver(() => annotateLauncher(node, model.me));
      observer.observe(node, { childList: true, subtree: true });
      annotateLauncher(node, model.me);
    });
  });
  model.changed.connect(() => launchers.forEach(node => annotateLauncher(node, model.me)));
}
