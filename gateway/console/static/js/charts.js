// Small time-series plots (uPlot, vendored under static/vendor) over the last minutes.

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];
export const WINDOW_SECONDS = 600;

export class TimeChart {
  // series: labels of the y series; the x series is unix seconds.
  constructor(parent, title, series) {
    this.data = [[], ...series.map(() => [])];
    const opts = {
      title,
      width: Math.max(260, Math.floor(parent.clientWidth || 320)),
      height: 150,
      cursor: { drag: { x: false, y: false } },
      legend: { live: false },
      scales: { y: { range: (u, min, max) => [0, Math.max(1, max * 1.15)] } },
      axes: [{ size: 30 }, { size: 46 }],
      series: [{}, ...series.map((label, i) => ({ label, stroke: COLORS[i], width: 1.5 }))],
    };
    this.plot = new window.uPlot(opts, this.data, parent);
    this.resize = () => this.plot.setSize({ width: Math.max(260, parent.clientWidth), height: 150 });
    window.addEventListener("resize", this.resize);
  }

  push(t, values) {
    const xs = this.data[0];
    if (xs.length && t <= xs[xs.length - 1]) return;
    xs.push(t);
    values.forEach((v, i) => this.data[i + 1].push(v));
    while (xs.length && xs[0] < t - WINDOW_SECONDS) {
      for (const s of this.data) s.shift();
    }
    this.plot.setData(this.data);
  }

  destroy() {
    window.removeEventListener("resize", this.resize);
    this.plot.destroy();
  }
}
