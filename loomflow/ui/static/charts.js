// The analytics page's charts, written here: it hands each figure that the page embeds
// as data (<script type="application/json" id="figures">, the report's own plotly
// figures) to plotly.js, served by the console itself, and makes each bar or point that
// stands for sessions open them in the session list. No inline script: the console's
// Content Security Policy runs only its own files.
"use strict";

function drawCharts() {
  const holder = document.getElementById("figures");
  if (!holder || !window.Plotly) return;
  const data = JSON.parse(holder.textContent);
  for (const chart of data.charts) {
    const element = document.getElementById(chart.name);
    if (!element) continue;
    const layout = Object.assign({}, chart.figure.layout, { autosize: true });
    window.Plotly.newPlot(element, chart.figure.data, layout, data.config).then(() => {
      element.on("plotly_click", (event) => {
        const point = event.points && event.points[0];
        if (!point) return;
        const links = chart.links[point.curveNumber] || [];
        const link = links[point.pointNumber];
        // only the console's own list: a link is a path of this origin
        if (typeof link === "string" && link.startsWith("/") && !link.startsWith("//")) {
          window.location.assign(link);
        }
      });
    });
  }
}

document.addEventListener("DOMContentLoaded", drawCharts);
