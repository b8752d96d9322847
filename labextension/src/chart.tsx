/**
 * A stacked time-series plot drawn by uPlot: one band per kernel, so that the
 * plot shows each kernel's share of a GPU over time. The legend is our own HTML
 * (readable by screen readers and themable); the canvas carries a text summary.
 */

import * as React from 'react';
import uPlot from 'uplot';

import { formatClock, formatClockSeconds } from './format';
import { __ } from './i18n';
import { latestValue, type IStackedSeries } from './admin';

function themeColour(name: string, fallback: string): string {
  const value = getComputedStyle(document.body).getPropertyValue(name).trim();
  return value || fallback;
}

function options(
  data: IStackedSeries,
  width: number,
  height: number,
  span: () => [number, number]
): uPlot.Options {
  const text = themeColour('--jp-ui-font-color1', '#333');
  const grid = themeColour('--jp-border-color2', '#ddd');
  const axis = (values?: uPlot.Axis['values']): uPlot.Axis => ({
    stroke: text,
    grid: { stroke: grid, width: 1 },
    ticks: { stroke: grid, width: 1 },
    font: '11px system-ui, sans-serif',
    ...(values ? { values } : {})
  });
  // The top of the stack first: each band is filled down to zero and the ones below are drawn over it.
  // Steps: a reading holds until the next one (what the stacked values mean).
  const steps = uPlot.paths.stepped!({ align: 1 });
  const series: uPlot.Series[] = [...data.series].reverse().map(s => ({
    label: s.label,
    stroke: s.colour,
    fill: s.colour + 'cc',
    width: 1,
    paths: steps,
    points: { show: false }
  }));
  return {
    width,
    height,
    legend: { show: false },
    cursor: { drag: { x: false, y: false } },
    scales: {
      // The whole window, whatever the readings: the axis neither starts at the first reading nor
      // jumps when a poll brings new data (span() reads the latest data's window).
      x: { time: true, range: () => span() },
      y: { range: [0, Math.max(data.max, 1)] }
    },
    axes: [
      // A short window needs the seconds to tell its ticks apart.
      axis((_u, splits) => {
        const [from, to] = span();
        return splits.map(t => (to - from < 1800 ? formatClockSeconds(t) : formatClock(t)));
      }),
      axis((_u, splits) => splits.map(v => `${Math.round(v)}${data.unit === '%' ? '%' : ''}`))
    ],
    series: [{}, ...series]
  };
}

function aligned(data: IStackedSeries): uPlot.AlignedData {
  return [data.times, ...[...data.series].reverse().map(s => s.stacked)];
}

/** A stacked plot with a caption, a text summary for screen readers and a legend table. */
export function StackedChart(props: {
  title: string;
  data: IStackedSeries;
  height?: number;
}): JSX.Element {
  const { data, title } = props;
  const height = props.height ?? 140;
  const host = React.useRef<HTMLDivElement>(null);
  const plot = React.useRef<uPlot | null>(null);
  const span = React.useRef<[number, number]>([data.from, data.to]);
  span.current = [data.from, data.to];
  const shape =
    data.series.map(s => s.key).join('|') + `|${data.max}|${document.body.dataset.jpThemeLight}`;

  React.useEffect(() => {
    const node = host.current;
    if (!node) {
      return;
    }
    const width = Math.max(node.clientWidth, 200);
    plot.current = new uPlot(
      options(data, width, height, () => span.current),
      aligned(data),
      node
    );
    const resize = new ResizeObserver(() => {
      plot.current?.setSize({ width: Math.max(node.clientWidth, 200), height });
    });
    resize.observe(node);
    return () => {
      resize.disconnect();
      plot.current?.destroy();
      plot.current = null;
    };
  }, [shape, height]); // a new set of kernels (or theme) is a new plot; new readings are new data

  React.useEffect(() => {
    plot.current?.setData(aligned(data));
  }, [data]);

  const latest = (s: IStackedSeries['series'][number]) => {
    const v = latestValue(s); // none for a kernel hibernated or ended
    return v === null
      ? '–'
      : data.unit === '%'
        ? `${Math.round(v)}%`
        : `${Math.round(v * 10) / 10} GiB`;
  };
  return (
    <figure
      className="jp-GpuPool-chart"
      data-series={data.series.length}
      data-points={data.times.length}
    >
      <figcaption className="jp-GpuPool-chartTitle">{title}</figcaption>
      <div
        className="jp-GpuPool-chartPlot"
        ref={host}
        role="img"
        aria-label={`${title}: ${data.summary}`}
      />
      {data.series.length ? (
        <table className="jp-GpuPool-legend">
          <caption className="jp-GpuPool-srOnly">{__('%1, now', title)}</caption>
          <tbody>
            {data.series.map(s => (
              <tr key={s.key}>
                <td>
                  <span
                    className="jp-GpuPool-swatch"
                    style={{ background: s.colour }}
                    aria-hidden="true"
                  />
                  {s.label}
                </td>
                <td className="jp-GpuPool-legendValue">{latest(s)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      ) : (
        <p className="jp-GpuPool-empty">{__('No kernel on this GPU in the last 10 minutes.')}</p>
      )}
    </figure>
  );
}
