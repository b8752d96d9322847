/**
 * The React components of the GPU panel: quota bars, one card per kernel, what
 * happened, the status bar item. They lay out the view models of view.ts and
 * call back for actions; they hold no state of the pool themselves.
 */

import * as React from 'react';

import { baseName, formatAgo, plainNote } from './format';
import { __ } from './i18n';
import { shownReservations } from './reservations';
import type { IMe, KernelAction } from './types';
import {
  cardView,
  HISTORY_KINDS,
  historyLine,
  IActionView,
  ICardView,
  IMeterView,
  pendingWarning,
  quotaBars,
  statusView
} from './view';
import { phaseWord, reservationSentence, reservationWords } from './words';

export interface IActions {
  /** Carry out an action on a kernel, asking first where `confirm` says so; `opener` gets focus back. */
  run(kernelId: string, action: IActionView, opener: HTMLElement | null): Promise<void>;
  open(path: string): void;
  /** Whether a cell of this browser's notebook waits on the kernel. */
  waiting(kernelId: string): boolean;
}

/** The bar of a share against a limit: a `meter` with its value (0..1 as a percentage). */
export function MeterTrack(props: {
  fraction: number;
  level: string;
  label: string;
  text: string;
}): JSX.Element {
  const pct = Math.round(props.fraction * 100);
  return (
    <div
      className={`jp-GpuPool-meterTrack jp-mod-${props.level}`}
      role="meter"
      aria-label={props.label}
      aria-valuemin={0}
      aria-valuemax={100}
      aria-valuenow={pct}
      aria-valuetext={props.text}
    >
      <div className="jp-GpuPool-meterFill" style={{ width: `${pct}%` }} />
    </div>
  );
}

/**
 * A horizontal bar: a share of something, its label and text above it. A `meter` where there is
 * a reading against a limit; a striped image where there is none (no reading, no limit).
 */
export function Meter(props: { view: IMeterView }): JSX.Element {
  const v = props.view;
  const name = `${v.label}: ${v.text}${v.note ? `, ${v.note}` : ''}`;
  return (
    <div className="jp-GpuPool-meter">
      <div className="jp-GpuPool-meterHead">
        <span className="jp-GpuPool-meterLabel">
          {v.label}
          {v.note ? <span className="jp-GpuPool-meterNote"> · {v.note}</span> : null}
        </span>
        <span className="jp-GpuPool-meterText">{v.text}</span>
      </div>
      {v.textOnly ? null : v.fraction === null ? (
        <div className="jp-GpuPool-meterTrack jp-mod-unknown" role="img" aria-label={name}>
          <div className="jp-GpuPool-meterFill jp-mod-unknown" />
        </div>
      ) : (
        <MeterTrack fraction={v.fraction} level={v.level} label={name} text={v.text} />
      )}
    </div>
  );
}

/** Utilization over the last minutes as an SVG line (0..100% bottom to top). */
export function Sparkline(props: { points: string; label: string; text: string }): JSX.Element {
  return (
    <div className="jp-GpuPool-meter jp-GpuPool-spark">
      <div className="jp-GpuPool-meterHead">
        <span
          className="jp-GpuPool-meterLabel"
          title={__('GPU utilization over the last 5 minutes')}
        >
          {__('Utilization')}
        </span>
        <span className="jp-GpuPool-meterText">{props.text}</span>
      </div>
      {props.points ? (
        <svg
          className="jp-GpuPool-sparkSvg"
          viewBox="0 0 100 24"
          preserveAspectRatio="none"
          role="img"
          aria-label={props.label}
        >
          <title>{props.label}</title>
          <line className="jp-GpuPool-sparkBase" x1="0" y1="23.5" x2="100" y2="23.5" />
          {props.points.includes(' ') ? (
            <polyline className="jp-GpuPool-sparkLine" points={props.points} />
          ) : null}
        </svg>
      ) : null}
    </div>
  );
}

/** How long a card keeps its buttons after an action while the server allows none. */
const HOLD_BUTTONS_MS = 10000;

export function KernelCard(props: { view: ICardView; actions: IActions }): JSX.Element {
  const v = props.view;
  const headingId = `jp-GpuPool-card-${v.kernelId}`;
  return (
    <section
      className={`jp-GpuPool-card jp-mod-${v.state.kind}${v.countdown ? ' jp-mod-warned' : ''}`}
      aria-labelledby={headingId}
      data-kernel-id={v.kernelId}
    >
      <CardHeader view={v} headingId={headingId} open={props.actions.open} />
      <div className="jp-GpuPool-gpu" title={v.gpu}>
        {v.gpu}
      </div>
      <div className={`jp-GpuPool-state jp-mod-${v.state.kind}`}>
        <span className="jp-GpuPool-stateDot" aria-hidden="true" />
        <span className="jp-GpuPool-stateLabel">{v.state.label}</span>
      </div>
      {v.state.detail ? <div className="jp-GpuPool-stateDetail">{v.state.detail}</div> : null}
      {v.queueWhy ? <div className="jp-GpuPool-queueWhy">{v.queueWhy}</div> : null}
      {v.borrowed ? <div className="jp-GpuPool-borrowed">{v.borrowed}</div> : null}
      <Meter view={v.memory} />
      <Sparkline
        points={v.utilization.points}
        label={v.utilization.label}
        text={v.utilization.text}
      />
      {v.countdown ? (
        <div className="jp-GpuPool-countdown" title={v.countdown.detail}>
          <strong className="jp-GpuPool-countdownTime" role="timer">
            {v.countdown.text}
          </strong>
          <span className="jp-GpuPool-countdownWhy">{v.countdown.message}</span>
        </div>
      ) : null}
      <CardActions view={v} actions={props.actions} />
    </section>
  );
}

/** The card's title (its notebook, a link that opens it) and its profile. */
function CardHeader(props: {
  view: ICardView;
  headingId: string;
  open: (path: string) => void;
}): JSX.Element {
  const v = props.view;
  return (
    <header className="jp-GpuPool-cardHeader">
      <h3 id={props.headingId} className="jp-GpuPool-cardTitle">
        {v.path.endsWith('.ipynb') ? (
          <button
            className="jp-GpuPool-link"
            title={__('Open %1', v.path)}
            onClick={() => props.open(v.path)}
          >
            {v.title}
          </button>
        ) : (
          <span title={v.path}>{v.title}</span>
        )}
      </h3>
      <span
        className="jp-GpuPool-profile"
        title={v.sliceLabel ? __('slice %1', v.sliceLabel) : undefined}
      >
        {v.profile}
      </span>
    </header>
  );
}

/** The card's buttons: the actions the server allows, each asking first where it says so. */
function CardActions(props: { view: ICardView; actions: IActions }): JSX.Element | null {
  const v = props.view;
  const [busy, setBusy] = React.useState<KernelAction | null>(null);
  // After an action the server allows none for a moment (a hibernation under way): the card keeps
  // the buttons it had, inert, the one pressed marked "…", instead of an empty row for a second.
  const [held, setHeld] = React.useState<{ actions: IActionView[]; action: KernelAction } | null>(
    null
  );
  const run = async (action: IActionView, opener: HTMLElement) => {
    setBusy(action.action);
    setHeld({ actions: v.actions, action: action.action });
    try {
      await props.actions.run(v.kernelId, action, opener);
    } finally {
      setBusy(null);
    }
  };
  const allowed = v.actions.map(a => a.action).join(' ');
  React.useEffect(() => {
    if (held && !busy && allowed && allowed !== held.actions.map(a => a.action).join(' ')) {
      setHeld(null); // the server allows other actions now: its own
    }
  }, [held, busy, allowed]);
  React.useEffect(() => {
    if (!held || busy) {
      return;
    }
    const timer = window.setTimeout(() => setHeld(null), HOLD_BUTTONS_MS);
    return () => window.clearTimeout(timer);
  }, [held, busy]);
  const holding = !v.actions.length && held !== null;
  const shown = holding ? held.actions : v.actions;
  const pressed = busy ?? (holding ? held.action : null);
  if (!shown.length) {
    return null;
  }
  return (
    <div className="jp-GpuPool-actions" role="group" aria-label={__('Actions for %1', v.title)}>
      {shown.map(a => (
        <button
          key={a.action}
          className={`jp-Button jp-GpuPool-action jp-mod-${a.action}${
            a.action === 'snooze' ? ' jp-mod-accept' : ''
          }`}
          title={a.title}
          aria-label={`${a.label}: ${v.title}`}
          aria-busy={pressed === a.action}
          aria-disabled={holding || undefined}
          onClick={event => {
            if (busy === null && !holding) {
              void run(a, event.currentTarget);
            }
          }}
        >
          {pressed === a.action ? `${a.label}…` : a.label}
        </button>
      ))}
    </div>
  );
}

/**
 * The admin's reservations, as this user reads them: members' room first ("ML 101 lab: 160 GiB
 * reserved until 12:00", "for you"), then what is kept from them and when. Calm: a list, no alert.
 */
function ReservationSection(props: { me: IMe; now: number }): JSX.Element | null {
  const shown = shownReservations(props.me);
  if (!shown.length) {
    return null;
  }
  return (
    <section className="jp-GpuPool-reservations" aria-labelledby="jp-GpuPool-reservations-title">
      <h2 id="jp-GpuPool-reservations-title" className="jp-GpuPool-sectionTitle">
        {__('Reserved GPU room')}
      </h2>
      <ul className="jp-GpuPool-list">
        {shown.map(r => (
          <li
            key={`${r.name}-${r.start}`}
            className={`jp-GpuPool-reservation jp-mod-${r.phase}${r.member ? ' jp-mod-member' : ''}`}
            title={reservationSentence(r, props.now)}
          >
            <span className="jp-GpuPool-reservationWords">{reservationWords(r, props.now)}</span>
            <span className="jp-GpuPool-muted jp-GpuPool-reservationPhase">
              {r.member ? __('%1, for you', phaseWord(r.phase)) : phaseWord(r.phase)}
            </span>
          </li>
        ))}
      </ul>
    </section>
  );
}

function QuotaSection(props: { me: IMe }): JSX.Element {
  return (
    <section className="jp-GpuPool-quota" aria-label={__('Your GPU quota')}>
      {quotaBars(props.me).map(b => (
        <Meter key={b.label} view={b} />
      ))}
    </section>
  );
}

/** Entries of "What happened" shown at once; the rest is one click away. */
const HISTORY_SHOWN = 3;

function History(props: { me: IMe; now: number }): JSX.Element | null {
  const { me, now } = props;
  const recent = [...me.recent]
    .filter(r => HISTORY_KINDS.has(r.kind))
    .sort((a, b) => b.at - a.at)
    .slice(0, 15);
  if (!recent.length) {
    return null;
  }
  const item = (r: (typeof recent)[number], i: number) => (
    <li key={`${r.at}-${r.kernel_id}-${i}`} title={r.message}>
      <span className="jp-GpuPool-when">{formatAgo(now, r.at)}</span>{' '}
      {baseName(r.name ?? '') ? (
        <strong className="jp-GpuPool-historyName">{baseName(r.name ?? '')}</strong>
      ) : null}{' '}
      {historyLine(r)}
    </li>
  );
  const rest = recent.slice(HISTORY_SHOWN);
  return (
    <section className="jp-GpuPool-history" aria-label={__('What happened')}>
      <h2 className="jp-GpuPool-sectionTitle">{__('What happened')}</h2>
      <ul className="jp-GpuPool-list jp-GpuPool-recent">
        {recent.slice(0, HISTORY_SHOWN).map(item)}
      </ul>
      {rest.length ? (
        <details className="jp-GpuPool-more">
          <summary>{__('%1 earlier', rest.length)}</summary>
          <ul className="jp-GpuPool-list jp-GpuPool-recent">
            {rest.map((r, i) => item(r, i + HISTORY_SHOWN))}
          </ul>
        </details>
      ) : null}
    </section>
  );
}

export function MyKernels(props: { me: IMe; now: number; actions: IActions }): JSX.Element {
  const { me, now } = props;
  return (
    <div className="jp-GpuPool-mine">
      <QuotaSection me={me} />
      <ReservationSection me={me} now={now} />
      <h2 className="jp-GpuPool-sectionTitle">{__('Your GPU kernels')}</h2>
      {me.kernels.length === 0 ? (
        <p className="jp-GpuPool-empty">
          {__(
            'No kernel of yours holds a GPU slice. Start one from the launcher with a GPU kernel (“Python 3 · GPU …”).'
          )}
        </p>
      ) : (
        // A kernel with a pending action first: its card must not sit under a notification.
        [...me.kernels]
          .sort((a, b) => Number(!!pendingWarning(b)) - Number(!!pendingWarning(a)))
          .map(k => (
            <KernelCard
              key={k.kernel_id}
              view={cardView(k, now, props.actions.waiting(k.kernel_id), me)}
              actions={props.actions}
            />
          ))
      )}
      <History me={me} now={now} />
      <p className="jp-GpuPool-note">{plainNote(me.pool.note)}</p>
    </div>
  );
}

/** The status bar item: text and colour from statusView; a button that opens the panel. */
export function StatusItem(props: {
  me: IMe | null;
  error: string | null;
  now: number;
  unreachableSince?: number | null;
  onOpen: () => void;
}): JSX.Element {
  const v = statusView(props.me, props.error, props.now, props.unreachableSince ?? null);
  const label =
    v.level === 'warning'
      ? __('GPU pool: %1, an idle action is pending. Open the GPU panel.', v.text)
      : v.level === 'near'
        ? __('GPU pool: %1, close to your quota. Open the GPU panel.', v.text)
        : __('GPU pool: %1. Open the GPU panel.', v.text);
  return (
    <button
      className={`jp-GpuPool-pill jp-GpuPool-status jp-mod-${v.level}`}
      title={v.title}
      aria-label={label}
      onClick={props.onOpen}
    >
      <span className="jp-GpuPool-statusDot" aria-hidden="true" />
      {v.short === v.text ? (
        <span className="jp-GpuPool-statusText">{v.text}</span>
      ) : (
        <>
          <span className="jp-GpuPool-statusText jp-mod-full">{v.text}</span>
          <span className="jp-GpuPool-statusText jp-mod-short">{v.short}</span>
        </>
      )}
    </button>
  );
}
