/**
 * The Lumino widgets JupyterLab places: the status bar item, the GPU side
 * panel, the notebook toolbar's slice indicator and the admin dashboard. Each
 * re-renders when the model changes.
 */

import type { ISessionContext } from '@jupyterlab/apputils';
import { LabIcon, ReactWidget, UseSignal } from '@jupyterlab/ui-components';
import type { Message } from '@lumino/messaging';
import { Widget } from '@lumino/widgets';
import * as React from 'react';
import { flushSync } from 'react-dom';

import { IActions, MyKernels, StatusItem } from './components';
import { Dashboard, IAdminActions } from './dashboard';
import { plainNote } from './format';
import { __ } from './i18n';
import type { PoolModel } from './model';
import type { Notebooks } from './notebooks';
import { indicatorView, pendingWarning, statusView } from './view';

const GPU_SVG = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M4 7h14a2 2 0 0 1 2 2v6a2 2 0 0 1-2 2H4zm3 3v4h2v-4zm4 0v4h2v-4zm4 0v4h2v-4z"/>
    <path d="M2 5h2v14H2zM6 17h2v3H6zm4 0h2v3h-2zm4 0h2v3h-2z"/>
  </g>
</svg>`;

export const gpuIcon = new LabIcon({ name: 'jupyter-gpu-pool:gpu', svgstr: GPU_SVG });

/**
 * Opened from the palette, the status bar or a notification, the keyboard goes where the eyes go:
 * into the widget, a frame later (the palette gives the focus back to the notebook as it closes).
 */
function focusSoon(widget: ReactWidget): void {
  requestAnimationFrame(() => {
    if (widget.isVisible && !widget.node.contains(document.activeElement)) {
      widget.node.focus();
    }
  });
}

export class StatusWidget extends ReactWidget {
  constructor(
    private readonly _model: PoolModel,
    private readonly _open: () => void
  ) {
    super();
    this.addClass('jp-GpuPool-statusItem');
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._model.changed}>
        {() => (
          <StatusItem
            me={this._model.me}
            error={this._model.error}
            now={this._model.serverNow()}
            unreachableSince={this._model.unreachableSince}
            onOpen={this._open}
          />
        )}
      </UseSignal>
    );
  }
}

/** Re-render every second while something ticks (a countdown), so that it counts down. */
function useTick(active: boolean): void {
  const [, setTick] = React.useState(0);
  React.useEffect(() => {
    if (!active) {
      return;
    }
    const timer = window.setInterval(() => setTick(t => t + 1), 1000);
    return () => window.clearInterval(timer);
  }, [active]);
}

/**
 * Re-render at once (synchronously) when a notebook's kernel connection changes status: a cell sent
 * to a hibernated kernel shows it resuming, which on a declared GPU lasts a moment only.
 */
function useStatus(notebooks: Notebooks): void {
  const [, rerender] = React.useReducer((n: number) => n + 1, 0);
  React.useEffect(() => {
    const now = () => flushSync(rerender);
    notebooks.statusChanged.connect(now);
    return () => {
      notebooks.statusChanged.disconnect(now);
    };
  }, [notebooks]);
}

function PanelBody(props: {
  model: PoolModel;
  notebooks: Notebooks;
  actions: IActions;
  visible: boolean;
  openDashboard: () => void;
}): JSX.Element {
  const { model } = props;
  useStatus(props.notebooks);
  const me = model.me;
  const admin = !!me?.admin && !!me?.pool.enabled;
  const lost = model.unreachableSince;
  useTick(props.visible && lost === null && !!me?.kernels.some(k => pendingWarning(k)));
  // Unreachable, the panel stays at the server's last answer: its clock stops there too, so that
  // no countdown reaches "hibernating now" on a server that is gone.
  const now = lost ?? model.serverNow();
  const status = statusView(me, model.error, model.serverNow(), lost);
  let body: JSX.Element;
  if (!me) {
    body = <p className="jp-GpuPool-empty">{status.title}</p>;
  } else if (!me.pool.enabled) {
    body = (
      <p className="jp-GpuPool-empty">
        {__('No GPU pool on this server. %1', plainNote(me.pool.note))}
      </p>
    );
  } else {
    body = <MyKernels me={me} now={now} actions={props.actions} />;
  }
  return (
    <div className="jp-GpuPool-panelBody">
      <div className="jp-GpuPool-panelHeader">
        <h1 className="jp-GpuPool-panelTitle">{__('GPU pool')}</h1>
        <span
          className={`jp-GpuPool-pill jp-mod-${status.level} jp-GpuPool-headerStatus`}
          title={status.title.replace(/\n?[^\n]*GPU panel\.$/, '')}
        >
          {status.text}
        </span>
      </div>
      {admin ? (
        <button className="jp-Button jp-GpuPool-dashboardLink" onClick={props.openDashboard}>
          {__('Open the pool dashboard')}
        </button>
      ) : null}
      {lost !== null ? (
        <p className="jp-GpuPool-unreachable" role="alert">
          {status.title}
        </p>
      ) : null}
      <div className={lost !== null ? 'jp-GpuPool-stale' : undefined}>{body}</div>
    </div>
  );
}

export class GpuPanel extends ReactWidget {
  constructor(
    private readonly _model: PoolModel,
    private readonly _notebooks: Notebooks,
    private readonly _actions: IActions,
    private readonly _openDashboard: () => void
  ) {
    super();
    // A cell that starts waiting on a hibernated kernel: GET me is read again at once, so that a place
    // in the queue shows without waiting for the next poll.
    _notebooks.statusChanged.connect(() => void this._model.refresh());
    this.id = 'jp-gpu-pool-panel';
    this.addClass('jp-GpuPool-panel');
    this.title.icon = gpuIcon;
    this.title.caption = __('GPU pool: your GPU kernels and quota');
    this.node.setAttribute('role', 'region');
    this.node.setAttribute('aria-label', __('GPU pool'));
    this.node.tabIndex = -1;
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._model.changed}>
        {() => (
          <PanelBody
            model={this._model}
            notebooks={this._notebooks}
            actions={this._actions}
            visible={this.isVisible}
            openDashboard={this._openDashboard}
          />
        )}
      </UseSignal>
    );
  }

  protected onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    focusSoon(this);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this.update();
    void this._model.refresh();
    this._clearToasts(true);
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this.update();
    this._clearToasts(false);
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._clearToasts(this.isVisible);
  }

  dispose(): void {
    this._clearToasts(false);
    super.dispose();
  }

  /**
   * JupyterLab's toasts sit at the bottom right, over the panel's buttons: while the panel is open
   * they move left of it (the stylesheet reads --jp-GpuPool-toastRight).
   */
  private _clearToasts(open: boolean): void {
    const body = document.body;
    const left = this.node.getBoundingClientRect().left;
    if (open && left > 0) {
      body.style.setProperty(
        '--jp-GpuPool-toastRight',
        `${Math.ceil(window.innerWidth - left) + 8}px`
      );
      body.classList.add('jp-GpuPool-panelOpen');
    } else {
      body.classList.remove('jp-GpuPool-panelOpen');
    }
  }
}

/** The admin dashboard's content; polling GET pool runs only while it is shown. */
export class DashboardWidget extends ReactWidget {
  constructor(
    private readonly _model: PoolModel,
    private readonly _actions: IAdminActions
  ) {
    super();
    this.id = 'jp-gpu-pool-dashboard';
    this.addClass('jp-GpuPool-dashboardWidget');
    this.title.icon = gpuIcon;
    this.title.label = __('GPU pool');
    this.title.caption = __('GPU pool dashboard: GPUs, kernels, queue and the policy’s decisions');
    this.node.tabIndex = -1;
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._model.changed}>
        {() => (
          <Dashboard
            pool={this._model.pool}
            telemetry={this._model.telemetry}
            error={this._model.poolError}
            telemetryError={this._model.telemetryError}
            now={this._model.serverNow()}
            actions={this._actions}
            profiles={this._model.me?.profiles}
          />
        )}
      </UseSignal>
    );
  }

  protected onActivateRequest(msg: Message): void {
    super.onActivateRequest(msg);
    focusSoon(this);
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    this._model.poolWanted = true;
  }

  /** The only tab of an empty main area is never hidden, so never shown either: attached, it reads. */
  protected onAfterAttach(msg: Message): void {
    super.onAfterAttach(msg);
    if (this.isVisible) {
      this._model.poolWanted = true;
    }
  }

  protected onAfterHide(msg: Message): void {
    super.onAfterHide(msg);
    this._model.poolWanted = false;
  }

  dispose(): void {
    this._model.poolWanted = false;
    super.dispose();
  }
}

/** "GPU 0 (declared)" in the notebook's toolbar: where its kernel's slice is. */
export class SliceIndicator extends ReactWidget {
  constructor(
    private readonly _model: PoolModel,
    private readonly _session: ISessionContext,
    private readonly _open: () => void
  ) {
    super();
    this.addClass('jp-GpuPool-indicator');
    _session.kernelChanged.connect(this.update, this);
  }

  render(): JSX.Element {
    return (
      <UseSignal signal={this._model.changed}>
        {() => {
          const v = indicatorView(this._model.me, this._session.session?.kernel?.id ?? null);
          if (!v.visible) {
            return <span className="jp-GpuPool-indicatorEmpty" />;
          }
          return (
            <button
              className={`jp-GpuPool-indicatorButton jp-mod-${v.kind}`}
              title={v.title}
              aria-label={__('GPU slice of this kernel: %1. Open the GPU panel.', v.text)}
              onClick={this._open}
            >
              <gpuIcon.react tag="span" className="jp-GpuPool-indicatorIcon" />
              <span className="jp-GpuPool-indicatorText">{v.text}</span>
            </button>
          );
        }}
      </UseSignal>
    );
  }
}
