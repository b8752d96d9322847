/**
 * What the notifications say: a warning before a cull or hibernation (what the user loses and what
 * they can still do), an explanation afterwards (what happened and why, instead of a bare "kernel
 * died"), a refusal with advice that fits the limit hit, and the record each leaves in the
 * notification centre once it no longer holds. Sentences only, built from the catalogue of words
 * (words.ts); which of them are shown is facts.ts's, the notifications toasts.ts's.
 */

import { baseName, formatClock, formatDeadline, formatDuration } from './format';
import { __ } from './i18n';
import { warnedFor } from './reservations';
import type { IKernel, IMe, IReservation } from './types';
import { canKeepAlive, declaredNote, onMps } from './view';
import { kindWord, reasonPhrase, reservedFor, sentence } from './words';

export type NoticeType = 'info' | 'success' | 'warning' | 'error';

/** JupyterLab cuts a toast's message after this many characters. */
export const TOAST_LIMIT = 140;

/** A notebook's name short enough for a toast ("." or "/" names nothing: a kernel without a notebook). */
export function shortName(name: string | undefined | null, fallback?: string): string {
  const base = name ? baseName(name) : '';
  if (!base) {
    return fallback ?? __('A GPU kernel');
  }
  return base.length > 28 ? `${base.slice(0, 27)}…` : base;
}

/**
 * "gpu-demo.ipynb’s kernel": it is the kernel that goes, not the notebook. `within`: the words go
 * within a sentence, not at its start ("a GPU kernel").
 */
export function kernelOf(name: string | undefined | null, within = false): string {
  const short = shortName(name, '');
  return short ? __('%1’s kernel', short) : within ? __('a GPU kernel') : __('A GPU kernel');
}

/** Within the toast's limit (the templates are written to fit; this is the guarantee). */
export function fit(text: string): string {
  return text.length > TOAST_LIMIT ? `${text.slice(0, TOAST_LIMIT - 1)}…` : text;
}

/** The first (fullest) wording that fits the toast; the last one is written to fit a long name. */
export function fitting(...wordings: string[]): string {
  return wordings.find(w => w.length <= TOAST_LIMIT) ?? fit(wordings[wordings.length - 1]);
}

/** The launcher name of a profile id, from GET me's profiles. */
function launcherName(me: IMe | null, profile: string | undefined): string {
  const found = me?.profiles?.find(p => p.name === profile);
  return found?.launcher_name ?? (profile ? profile : __('A GPU kernel'));
}

/**
 * What to do after a refused start, fitted to the limit hit: a kernel-count quota is helped only
 * by shutting one down; a memory quota or a full pool by what would start now; a pool without
 * GPUs only by the admin.
 */
export function refusalAdvice(
  reason: string | undefined,
  me: IMe | null,
  profile?: string
): string {
  const fits = (me?.profiles ?? [])
    .filter(p => p.starts_now && p.name !== profile)
    .map(p => p.launcher_name);
  const wouldStart =
    fits.length > 1
      ? __('‘%1’ or ‘%2’ would start now.', fits[0], fits[1])
      : fits.length
        ? __('‘%1’ would start now.', fits[0])
        : '';
  switch (reason) {
    case 'quota_exceeded': {
      if (me && me.quota.kernels !== null && me.usage.kernels >= me.quota.kernels) {
        return __(
          'You hold %1 of %2 GPU kernels: shut one down first.',
          me.usage.kernels,
          me.quota.kernels
        );
      }
      return wouldStart || __('Shut a GPU kernel down to make room in your quota.');
    }
    case 'pool_exhausted':
      if (me && me.pool.gpus === 0) {
        return __('The pool has no GPUs: tell your admin.');
      }
      return wouldStart || __('Try again when an idle kernel gives its slice back.');
    case 'queue_timeout':
      return wouldStart || __('No slice freed up in time: try again later.');
    case 'budget_exceeded':
      return __('Save your work; your GPU time resets with the next period.');
    case 'mps':
    case 'mps_user_busy':
      return __('Pick a profile without an SM share.');
    case 'config':
      return __('Tell your admin: the GPU pool is misconfigured.');
    default:
      return __('The GPU panel shows your quota and your kernels.');
  }
}

/** What a happening's sentences need besides its kind, kernel name and reason. */
export interface IHappeningContext {
  /** GET me after it: a refusal's advice (what would start now) is read from it. */
  me?: IMe | null;
  profile?: string;
  declared?: boolean;
  action?: string;
  /** It ended because its server stopped. */
  withServer?: boolean;
}

/**
 * What happened and how to go on, in one toast, for what needs the user now: a loss of state and a
 * refusal. Short sentences of our own, not the server's long message.
 */
export function explanation(
  kind: string,
  name: string | undefined,
  reason: string | undefined,
  message: string,
  context: IHappeningContext = {}
): string {
  const who = kernelOf(name);
  const why = reasonPhrase(reason);
  switch (kind) {
    case 'culled':
      return fitting(
        __(
          '%1 was shut down (%2): its variables are gone. Start a new kernel and run your cells again.',
          who,
          why
        ),
        __('%1 was shut down (%2): its variables are gone. Start a new kernel.', who, why),
        __('%1 was shut down: its variables are gone. Start a new kernel.', who)
      );
    case 'refused':
      return refusalExplanation(who, reason, context);
    case 'reclaimed':
    case 'released':
      if (context.withServer) {
        return fit(__('%1 ended when the server stopped: its variables are gone.', who));
      }
      return kind === 'reclaimed'
        ? fit(__('%1 ended, so its GPU slice went back to the pool.', who))
        : fitting(
            __(
              '%1 was shut down to give its GPU slice back (%2): its variables are gone.',
              who,
              why
            ),
            __('%1 was shut down (%2): its variables are gone.', who, why)
          );
    default:
      return fit(sentence(__('%1: %2', shortName(name), message || kindWord(kind))));
  }
}

/** A refused start (with advice that fits the limit hit), resume, first cell or move of GPU memory. */
function refusalExplanation(
  who: string,
  reason: string | undefined,
  context: IHappeningContext
): string {
  const why = reasonPhrase(reason);
  if (reason === 'hibernation_failed') {
    // A move of its GPU memory failed; the event does not say which, nor whether the kernel kept running
    // (a failed hibernation the pool ordered keeps it running; a failed Release shuts it down): the
    // panel's "What happened" says, in the server's words.
    return fitting(
      __(
        '%1: a hibernation or resume failed. The GPU panel’s “What happened” says whether it kept running, and what to do.',
        who
      ),
      __('%1: a hibernation or resume failed; the GPU panel says what happened.', who)
    );
  }
  switch (context.action) {
    case 'resume':
      return fit(__('%1 could not resume: %2. Its variables are kept.', who, why));
    case 'first_cell':
      return fit(__('%1 could not take its GPU slice, so its cell did not run: %2.', who, why));
    case 'hibernate':
      return fit(__('%1 did not hibernate now (%2); it keeps running.', who, why));
  }
  const profile = launcherName(context.me ?? null, context.profile);
  return fitting(
    __(
      '‘%1’ could not start: %2. %3',
      profile,
      why,
      refusalAdvice(reason, context.me ?? null, context.profile)
    ),
    __('‘%1’ could not start: %2. The GPU panel says why.', profile, why)
  );
}

/**
 * What happened, as the notification centre keeps it once nothing is left to do about it (or where
 * it never needed the user): past tense, with the time, no advice that could turn false.
 */
export function recordLine(
  kind: string,
  name: string | undefined,
  reason: string | undefined,
  at: string,
  context: IHappeningContext = {}
): string {
  const who = kernelOf(name, true);
  const why = reasonPhrase(reason);
  const declared = context.declared ? ` (${declaredNote()})` : '';
  if (context.withServer && (kind === 'released' || kind === 'reclaimed')) {
    return fit(__('At %1, %2 ended when the server stopped: its variables are gone.', at, who));
  }
  switch (kind) {
    case 'hibernated':
      return fitting(
        __('At %1, %2 hibernated (%3): its variables were kept%4.', at, who, why, declared),
        __('At %1, %2 hibernated (%3): its variables were kept.', at, who, why),
        __('At %1, %2 hibernated: its variables were kept.', at, who)
      );
    case 'resumed':
      return fit(__('At %1, %2 resumed: it took a GPU slice again.', at, who));
    case 'queued':
      return fit(__('At %1, %2 joined the queue for a GPU slice.', at, who));
    case 'over_memory':
      return fit(__('At %1, %2 used more GPU memory than its slice.', at, who));
    case 'culled':
      return fitting(
        __('At %1, %2 was shut down (%3): its variables are gone.', at, who, why),
        __('At %1, %2 was shut down: its variables are gone.', at, who)
      );
    case 'reclaimed':
      return fit(__('At %1, %2 ended, so its GPU slice went back to the pool.', at, who));
    case 'released':
      return context.action === 'hibernate'
        ? fitting(
            __('At %1, %2 gave its GPU slice back (%3): its variables were kept.', at, who, why),
            __('At %1, %2 gave its GPU slice back: its variables were kept.', at, who)
          )
        : fitting(
            __(
              'At %1, %2 was shut down to give its GPU slice back (%3): its variables are gone.',
              at,
              who,
              why
            ),
            __(
              'At %1, %2 was shut down to give its GPU slice back: its variables are gone.',
              at,
              who
            )
          );
    case 'refused':
      return refusalRecord(at, who, reason, context);
    default:
      return fit(sentence(__('At %1, %2: %3', at, who, kindWord(kind))));
  }
}

function refusalRecord(
  at: string,
  who: string,
  reason: string | undefined,
  context: IHappeningContext
): string {
  const why = reasonPhrase(reason);
  if (reason === 'hibernation_failed') {
    return fit(
      __(
        'At %1, a hibernation or resume of %2 failed; the GPU panel’s “What happened” says more.',
        at,
        who
      )
    );
  }
  switch (context.action) {
    case 'resume':
      return fitting(
        __('At %1, %2 could not resume (%3); its variables were kept.', at, who, why),
        __('At %1, %2 could not resume; its variables were kept.', at, who)
      );
    case 'first_cell':
      return fitting(
        __('At %1, %2 could not take its GPU slice (%3), so its cell did not run.', at, who, why),
        __('At %1, %2 could not take its GPU slice, so its cell did not run.', at, who)
      );
    case 'hibernate':
      return fitting(
        __('At %1, %2 did not hibernate (%3); it kept running.', at, who, why),
        __('At %1, %2 did not hibernate; it kept running.', at, who)
      );
  }
  const profile = launcherName(context.me ?? null, context.profile);
  return fitting(
    __('At %1, ‘%2’ could not start: %3.', at, profile, why),
    __('At %1, ‘%2’ could not start.', at, profile)
  );
}

/** The same text, told again: "… (5 times)", within the toast's limit (the message is cut, never the count). */
export function counted(message: string, times: number): string {
  if (times <= 1) {
    return message;
  }
  const suffix = __(' (%1 times)', times);
  const room = TOAST_LIMIT - suffix.length;
  const text = message.length > room ? `${message.slice(0, room - 1)}…` : message;
  return `${text}${suffix}`;
}

/**
 * The toast before a cull or hibernation: whose kernel, an absolute time (a toast does not tick),
 * what is lost or kept, and what the user can still do (Keep alive only while snoozes are left).
 */
export function warningMessage(
  kernel: IKernel,
  now?: number,
  reservations?: ReadonlyArray<IReservation>
): string {
  const w = kernel.warning!;
  const who = kernelOf(kernel.name);
  // To the minute, with its seconds when under two minutes away ("at 21:10" read as past at 21:10:55).
  const at = now === undefined ? formatClock(w.deadline) : formatDeadline(w.deadline, now);
  if (w.reason === 'pressure') {
    return pressureMessage(kernel, who, at, now);
  }
  if (w.reason === 'reserved') {
    return reservedMessage(kernel, who, at, warnedFor(kernel, reservations), now ?? w.deadline);
  }
  if (w.reason === 'over_memory') {
    return fit(
      __(
        '%1 shuts down at %2: it uses more GPU memory than its slice. Free some to keep it.',
        who,
        at
      )
    );
  }
  if (w.reason === 'budget') {
    return fit(__('%1 gives its GPU back at %2: your GPU time runs out. Save your work.', who, at));
  }
  const why = reasonPhrase(w.reason);
  if (w.action === 'hibernate') {
    return hibernateWarning(kernel, who, at, why);
  }
  return onMps(kernel) ? mpsWarning(kernel, who, at, why) : shutdownWarning(kernel, who, at, why);
}

/**
 * A kernel giving back room a reservation keeps for others: when, for which reservation ("reserved for
 * ML 101 lab from 10:00"), and what it keeps. No Keep alive, and no "run a cell to keep it": neither
 * keeps reserved room.
 */
function reservedMessage(
  kernel: IKernel,
  who: string,
  at: string,
  r: IReservation | null,
  now: number
): string {
  const why = reservedFor(r, now);
  const name = r?.name ?? '';
  if (kernel.warning!.action === 'hibernate') {
    return fitting(
      __('%1 hibernates at %2: its GPU room is %3. Its variables are kept.', who, at, why),
      __('%1 hibernates at %2, variables kept: its room is %3.', who, at, why),
      ...(name
        ? [__('%1 hibernates at %2, variables kept: its room is reserved for %3.', who, at, name)]
        : []),
      __(
        '%1 hibernates at %2: its GPU room is reserved for others. Its variables are kept.',
        who,
        at
      )
    );
  }
  return fitting(
    __(
      '%1 shuts down at %2: its GPU room is %3. Its variables will be lost: save your work.',
      who,
      at,
      why
    ),
    __('%1 shuts down at %2, variables lost: its room is %3.', who, at, why),
    ...(name
      ? [__('%1 shuts down at %2, variables lost: its room is reserved for %3.', who, at, name)]
      : []),
    __('%1 shuts down at %2: its GPU room is reserved for others. Save your work.', who, at)
  );
}

/** A hibernation ahead: variables kept, slice given back. */
function hibernateWarning(kernel: IKernel, who: string, at: string, why: string): string {
  return canKeepAlive(kernel)
    ? fitting(
        __(
          '%1 hibernates at %2 (%3): variables kept, slice given back. Run a cell or Keep alive to keep it.',
          who,
          at,
          why
        ),
        __(
          '%1 hibernates at %2: variables kept, slice given back. Run a cell or Keep alive to keep it.',
          who,
          at
        )
      )
    : fitting(
        __(
          '%1 hibernates at %2 (%3): variables kept, slice given back. Run a cell to keep it.',
          who,
          at,
          why
        ),
        __('%1 hibernates at %2: variables kept, slice given back. Run a cell to keep it.', who, at)
      );
}

/** An MPS kernel's shutdown ahead: it would hibernate if it could; the loss is the surprise. */
function mpsWarning(kernel: IKernel, who: string, at: string, why: string): string {
  return canKeepAlive(kernel)
    ? fitting(
        __(
          '%1 shuts down at %2 (%3): it cannot hibernate, its variables will be lost. Run a cell or Keep alive.',
          who,
          at,
          why
        ),
        __(
          '%1 shuts down at %2: it cannot hibernate, its variables will be lost. Run a cell or Keep alive.',
          who,
          at
        )
      )
    : fitting(
        __(
          '%1 shuts down at %2 (%3): it cannot hibernate, its variables will be lost. Run a cell or save your work.',
          who,
          at,
          why
        ),
        __(
          '%1 shuts down at %2: it cannot hibernate, its variables will be lost. Save your work.',
          who,
          at
        )
      );
}

/** A shutdown ahead: its variables will be lost. */
function shutdownWarning(kernel: IKernel, who: string, at: string, why: string): string {
  return canKeepAlive(kernel)
    ? fitting(
        __(
          '%1 shuts down at %2 (%3): its variables will be lost. Run a cell or Keep alive to keep it.',
          who,
          at,
          why
        ),
        __(
          '%1 shuts down at %2: its variables will be lost. Run a cell or Keep alive to keep it.',
          who,
          at
        )
      )
    : fitting(
        __(
          '%1 shuts down at %2 (%3): its variables will be lost. Run a cell to keep it, or save your work.',
          who,
          at,
          why
        ),
        __(
          '%1 shuts down at %2: its variables will be lost. Run a cell to keep it, or save your work.',
          who,
          at
        )
      );
}

/**
 * The toast of a kernel chosen to give its slice to someone waiting in the queue: why this kernel (idle
 * that long), why now (someone waits), when, what it keeps, and what to do (its buttons: Keep alive
 * while snoozes are left, Release now).
 */
function pressureMessage(kernel: IKernel, who: string, at: string, now?: number): string {
  const idle =
    kernel.idle_since && now !== undefined ? formatDuration(now - kernel.idle_since) : '';
  const wordings =
    kernel.warning!.action === 'hibernate'
      ? [
          __(
            '%1 has been idle for %2 and someone waits for a GPU: it hibernates at %3, variables kept. Run a cell to keep it.',
            who,
            idle,
            at
          ),
          __(
            '%1, idle %2, hibernates at %3 for someone waiting for a GPU; variables kept. Run a cell to keep it.',
            who,
            idle,
            at
          )
        ]
      : [
          __(
            '%1 has been idle for %2 and someone waits for a GPU: it shuts down at %3, variables lost. Run a cell to keep it.',
            who,
            idle,
            at
          ),
          __(
            '%1, idle %2, shuts down at %3 for someone waiting for a GPU; variables lost. Run a cell to keep it.',
            who,
            idle,
            at
          )
        ];
  const last =
    kernel.warning!.action === 'hibernate'
      ? __(
          '%1 hibernates at %2 for someone waiting for a GPU; variables kept. Run a cell to keep it.',
          who,
          at
        )
      : __(
          '%1 shuts down at %2 for someone waiting for a GPU; its variables will be lost. Run a cell to keep it.',
          who,
          at
        );
  return idle ? fitting(...wordings, last) : fitting(last);
}
