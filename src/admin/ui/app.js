// sluice's admin page: polls /ui/data and draws it. No library, no build step.
(function () {
  "use strict";
  var KEY = "sluice.token";
  var params = new URLSearchParams(location.search);
  if (params.has("token")) {
    // Keep the token for this tab only, and take it out of the address bar and history.
    sessionStorage.setItem(KEY, params.get("token"));
    history.replaceState(null, "", "/ui");
  }
  var token = sessionStorage.getItem(KEY);

  function el(tag, attrs, children) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (k) {
      if (k === "text") e.textContent = attrs[k]; else e.setAttribute(k, attrs[k]);
    });
    (children || []).forEach(function (c) { if (c) e.appendChild(c); });
    return e;
  }

  function replace(id, nodes) {
    var box = document.getElementById(id);
    box.replaceChildren.apply(box, nodes);
  }

  function fmt(n) {
    if (n >= 100) return Math.round(n).toString();
    if (n >= 10) return n.toFixed(1);
    return n.toFixed(2);
  }

  function badge(text, kind) { return el("span", { "class": "badge " + (kind || ""), text: text }); }

  function status(d) {
    var b = d.backend, out = [badge("rules v" + d.version), badge("backend " + b.name)];
    if (b.reachable !== null) out.push(badge(b.reachable ? "Redis reachable" : "Redis unreachable", b.reachable ? "ok" : "bad"));
    if (b.breaker_open !== null) out.push(badge("breaker " + (b.breaker_open ? "open" : "closed"), b.breaker_open ? "bad" : "ok"));
    if (b.deny_cache !== null) out.push(badge("deny cache " + b.deny_cache));
    if (b.keys_held !== null) out.push(badge("keys held " + b.keys_held));
    replace("status", out);
    var err = document.getElementById("reload-error");
    if (d.last_reload_error) {
      err.hidden = false;
      err.textContent = "Last reload failed at " + new Date(d.last_reload_error.at * 1000).toLocaleString() +
        "; the previous rules stay active:\n" + d.last_reload_error.errors;
    } else {
      err.hidden = true;
    }
  }

  var SVG = "http://www.w3.org/2000/svg";
  // The newest value at the right edge, the oldest kept one at the left: the chart scrolls.
  function line(values, max, color, w, h, kept) {
    var n = values.length, pts = [], step = w / Math.max(kept - 1, 1);
    for (var i = 0; i < n; i++) {
      var x = w - (n - 1 - i) * step;
      var y = h - 2 - (max > 0 ? (values[i] / max) * (h - 4) : 0);
      pts.push(x.toFixed(1) + "," + y.toFixed(1));
    }
    var p = document.createElementNS(SVG, "polyline");
    p.setAttribute("points", pts.join(" "));
    p.setAttribute("fill", "none");
    p.setAttribute("stroke", color);
    p.setAttribute("stroke-width", "1.5");
    p.setAttribute("vector-effect", "non-scaling-stroke");
    return p;
  }

  function chart(s, kept) {
    var w = 300, h = 70, all = s.requests.concat(s.denied, s.near);
    var max = Math.max.apply(null, all.concat([1]));
    var svg = document.createElementNS(SVG, "svg");
    svg.setAttribute("viewBox", "0 0 " + w + " " + h);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "rates of " + s.rule);
    var base = document.createElementNS(SVG, "line");
    [["x1", 0], ["y1", h - 1], ["x2", w], ["y2", h - 1], ["stroke", "#d5d9de"], ["stroke-width", "1"]].forEach(function (a) {
      base.setAttribute(a[0], a[1]);
    });
    base.setAttribute("vector-effect", "non-scaling-stroke");
    svg.appendChild(base);
    var css = getComputedStyle(document.documentElement);
    [["requests", "--req"], ["near", "--near"], ["denied", "--den"]].forEach(function (k) {
      svg.appendChild(line(s[k[0]], max, css.getPropertyValue(k[1]).trim(), w, h, kept));
    });
    var last = function (v) { return v.length ? v[v.length - 1] : 0; };
    var now = "now " + fmt(last(s.requests)) + " req/s, " + fmt(last(s.denied)) + " denied/s, " +
      fmt(last(s.near)) + " near/s · max " + fmt(max);
    return el("div", { "class": "chart", "data-rule": s.domain + "." + s.rule }, [
      el("div", { "class": "title", text: s.domain + " · " + s.rule }),
      svg,
      el("div", { "class": "now", text: now }),
    ]);
  }

  function charts(d) {
    var list = d.series.rules;
    if (!list.length) return;
    replace("charts", list.map(function (s) { return chart(s, d.series.kept); }));
  }

  function top(d) {
    var blocks = [];
    d.top.domains.forEach(function (dom) {
      if (!dom.keys.length) return;
      var rows = dom.keys.map(function (k) {
        var cell = el("td", { "class": "top-key", text: k.key });
        cell.addEventListener("click", function () { askAbout(dom.domain, k.key); });
        return el("tr", {}, [
          cell,
          el("td", { text: k.rule || "(override)" }),
          el("td", { "class": "num", text: String(k.denied) }),
        ]);
      });
      blocks.push(el("div", { "class": "domain", text: dom.domain + " (±" + dom.error_bound + ")" }));
      blocks.push(el("table", {}, [
        el("thead", {}, [el("tr", {}, [el("th", { text: "key" }), el("th", { text: "rule" }), el("th", { "class": "num", text: "denied" })])]),
        el("tbody", {}, rows),
      ]));
    });
    if (!blocks.length) blocks.push(el("p", { "class": "muted", text: "Nothing denied." }));
    replace("top", blocks);
  }

  function limitText(l) {
    var per = l.unit_multiplier > 1 ? l.unit_multiplier + " " + l.unit.toLowerCase() + "s" : l.unit.toLowerCase();
    return l.requests_per_unit + " / " + per + " · " + l.algorithm + (l.burst !== l.requests_per_unit ? " · burst " + l.burst : "") +
      (l.charge === "always" ? " · charge always" : "");
  }

  function tree(rules) {
    return el("ul", { "class": "tree" }, rules.map(function (r) {
      var info = r.unlimited ? "unlimited" : r.limits.map(limitText).join("; ");
      if (r.shadow_mode) info += " · shadow";
      if (r.holds !== null && r.holds !== undefined) info += " · in flight " + r.holds;
      return el("li", {}, [
        el("span", { "class": "seg", text: r.segment }),
        info ? el("span", { "class": "lim", text: info }) : null,
        r.children.length ? tree(r.children) : null,
      ]);
    }));
  }

  function rules(d) {
    var out = [];
    d.rules.forEach(function (dom) {
      out.push(el("div", { "class": "domain", text: dom.domain }));
      var t = tree(dom.rules);
      t.classList.add("root");
      out.push(t);
    });
    replace("rules", out);
  }

  function poll() {
    var headers = token ? { Authorization: "Bearer " + token } : {};
    fetch("/ui/data", { headers: headers, cache: "no-store" })
      .then(function (r) {
        if (r.status === 401) {
          sessionStorage.removeItem(KEY);
          location.replace("/ui");
          throw new Error("unauthorized");
        }
        return r.json();
      })
      .then(function (d) {
        status(d); charts(d); top(d); rules(d);
        document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
      })
      .catch(function () {
        document.getElementById("updated").textContent = "not updated since " + new Date().toLocaleTimeString();
      });
  }

  // The "why" box: asks /why for the descriptors typed ("k=v k=v ; k=v"), shows the answer,
  // and offers /counters/reset for the same request.
  function whyRequest() {
    var descriptors = document.getElementById("why-entries").value.split(";").map(function (d) {
      return { entries: d.trim().split(/\s+/).filter(Boolean).map(function (kv) {
        var at = kv.indexOf("=");
        return at < 0 ? { key: kv, value: "" } : { key: kv.slice(0, at), value: kv.slice(at + 1) };
      }) };
    }).filter(function (d) { return d.entries.length; });
    return JSON.stringify({ domain: document.getElementById("why-domain").value.trim(), descriptors: descriptors });
  }

  function post(path, body) {
    var headers = { "Content-Type": "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    return fetch(path, { method: "POST", headers: headers, body: body, cache: "no-store" }).then(function (r) {
      return r.text().then(function (text) { return { status: r.status, text: text }; });
    });
  }

  function refused(a) {
    if (a.status === 401) return "401: the admin token was refused";
    return a.status + ": " + a.text.trim();
  }

  function secs(s) { return s >= 10 ? Math.round(s) + " s" : (Math.round(s * 10) / 10) + " s"; }

  function whyLimit(l) {
    var v = l.verdict, st = l.state;
    return el("tr", {}, [
      el("td", { text: l.algorithm + (l.name ? " (" + l.name + ")" : "") + (l.override ? " · override" : "") }),
      el("td", { text: limitText(l) }),
      el("td", { "class": "num remaining", text: String(st.remaining) }),
      el("td", { "class": "num", text: secs(st.reset_seconds) + (st.in_debt ? " (in debt)" : "") }),
      el("td", { "class": "verdict" + (v.admitted ? "" : " denied"), text: v.admitted ? "admits, " + v.remaining + " left" : "denies, retry in " + secs(v.reset_seconds) }),
    ]);
  }

  function whyDescriptor(d) {
    var m = d.match, rule = m.rule;
    var head = d.entries.map(function (e) { return e.key + "=" + e.value; }).join(" ");
    var lines = [
      el("div", { "class": "entries", text: head + " · cost " + d.cost }),
      el("div", { "class": "reason", text: (rule ? "rule " + rule.name + " (" + rule.location + ") · " : "") +
        (m.code === "matched" ? m.reason : m.code + ": " + m.reason) }),
      el("div", { "class": "muted", text: "applies: " + d.applies + (d.mode ? " · mode " + d.mode : "") +
        " · denied on this replica: " + d.denied.last_minute.cost + " last minute, " + d.denied.last_hour.cost + " last hour" }),
    ];
    if (d.limits.length) {
      lines.push(el("table", {}, [
        el("thead", {}, [el("tr", {}, ["limit", "quota", "remaining", "reset", "verdict now"].map(function (h) { return el("th", { text: h }); }))]),
        el("tbody", {}, d.limits.map(whyLimit)),
      ]));
    }
    return el("div", { "class": "why-desc" }, lines);
  }

  function showWhy(a) {
    var raw = document.getElementById("why-raw-box"), reset = document.getElementById("why-reset");
    if (a.status !== 200) {
      replace("why-answer", [el("p", { "class": "error", id: "why-error", text: refused(a) })]);
      raw.hidden = true;
      reset.disabled = true;
      return;
    }
    var w = JSON.parse(a.text), over = w.overall_code !== "OK";
    replace("why-answer", [el("div", { id: "why-verdict", "class": "why-verdict " + (over ? "over" : "ok"),
      text: "Verdict now: " + w.overall_code + " (backend " + w.backend + ", nothing charged)" })]
      .concat(w.descriptors.map(whyDescriptor)));
    document.getElementById("why-raw").textContent = JSON.stringify(w, null, 2);
    raw.hidden = false;
    reset.disabled = !w.domain_known;
  }

  // A top denied key (entries as in state keys: "k=v|k=v", escaped with %XX) in the box.
  function askAbout(domain, key) {
    document.getElementById("why-domain").value = domain;
    document.getElementById("why-entries").value = key.split("|").map(function (kv) {
      try { return decodeURIComponent(kv); } catch (e) { return kv; }
    }).join(" ");
    ask();
  }

  function ask() {
    document.getElementById("why-reset-result").hidden = true;
    return post("/why", whyRequest()).then(showWhy);
  }

  document.getElementById("why-form").addEventListener("submit", function (e) { e.preventDefault(); ask(); });
  document.getElementById("why-reset").addEventListener("click", function () {
    var out = document.getElementById("why-reset-result");
    post("/counters/reset", whyRequest()).then(function (a) {
      out.hidden = false;
      if (a.status !== 200) { out.textContent = "Reset refused: " + refused(a); return; }
      var r = JSON.parse(a.text);
      out.textContent = "Reset " + r.reset.length + " key(s) (" + r.held + " held) on every replica.";
      return post("/why", whyRequest()).then(showWhy);
    });
  });

  poll();
  setInterval(poll, 2000);
})();
