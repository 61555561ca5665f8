"use strict";
(function () {
  const charts = JSON.parse(document.getElementById("run-data").textContent).charts;
  const colors = ["#4e79a7", "#e15759", "#59a14f", "#f28e2b", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
                  "#ff9da7", "#bab0ac"];
  // Four significant digits: dygraphs' default of two decimals shows 0.0175 and 0.02 both as "0.02".
  const number = function (y) { return String(Number(y.toPrecision(4))); };
  let drawn = 0;
  for (const chart of charts) {
    const div = document.getElementById(chart.id);
    try {
      new Dygraph(div, chart.rows, {
        labels: chart.labels, title: chart.title, xlabel: chart.xlabel, ylabel: chart.ylabel,
        series: chart.series, connectSeparatedPoints: true, legend: "always", xRangePad: 8,
        colors: chart.labels.slice(1).map(function (label, i) { return colors[i % colors.length]; }),
        labelsDiv: document.getElementById(chart.id + "-legend"), labelsSeparateLines: false,
        // Steps and epochs are whole numbers: no ticks between them.
        axes: { x: { axisLabelFormatter: function (x) { return Number.isInteger(x) ? String(x) : ""; } },
                y: { axisLabelFormatter: number, valueFormatter: number, axisLabelWidth: 60 } },
        drawCallback: function (g, initial) {
          div.dataset.rows = g.numRows();
          div.dataset.series = g.getLabels().length - 1;
          if (initial) {
            div.dataset.drawn = "1";
            document.body.dataset.chartsDrawn = ++drawn;
          }
        }
      });
    } catch (error) {
      div.dataset.error = String(error);
      div.textContent = "This chart could not be drawn: " + error;
    }
  }
})();
