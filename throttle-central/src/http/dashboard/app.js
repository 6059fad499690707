// The central's dashboard: polls the monitor API and draws it. Plain DOM
// and SVG; names from the API only ever go in as text, never as markup.
'use strict';

const hash = new URLSearchParams(location.hash.slice(1));
if (hash.get('token')) localStorage.setItem('throttle-token', hash.get('token'));
const token = localStorage.getItem('throttle-token');
const EVERY_MS = Number(hash.get('every')) || 1000;
const TOP = Number(hash.get('top')) || 6;
// The slots drawn: as many as the central ranks its users over.
let WINDOW = 60;
const SVG = 'http://www.w3.org/2000/svg';
// The resource drawn, per service, as the reader last chose it.
const chosen = {};
// The user whose day of usage is drawn (`#service=S&user=U`, or a click
// on a user's name), and how often it is read again.
const usageOf = { service: hash.get('service') || '', user: hash.get('user') || '' };
const USAGE_EVERY_MS = 60000;

async function api(path) {
  const headers = token ? { authorization: 'Bearer ' + token } : {};
  const r = await fetch(path, { headers });
  if (r.status === 401) {
    throw new Error('this central needs its token: open /dashboard#token=YOUR_TOKEN');
  }
  if (!r.ok) {
    const why = await r.json().then((b) => b.error).catch(() => null);
    throw new Error(why || path + ': HTTP ' + r.status);
  }
  return r.json();
}

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  e.append(...children);
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

function short(x) {
  const a = Math.abs(x);
  if (a >= 1e9) return (x / 1e9).toFixed(1) + 'G';
  if (a >= 1e6) return (x / 1e6).toFixed(1) + 'M';
  if (a >= 1e4) return (x / 1e3).toFixed(1) + 'k';
  return String(Math.round(x * 10) / 10);
}

// A user's per-slot amounts from a top answer (oldest first, ending at
// `to`) as Map(slot -> amount).
function bySlot(amounts, to) {
  const map = new Map();
  amounts.forEach((amount, i) => map.set(to - amounts.length + 1 + i, amount));
  return map;
}

function total(map, from, to) {
  let sum = 0;
  for (const [slot, amount] of map || []) if (slot >= from && slot <= to) sum += amount;
  return sum;
}

// Admitted (and refused) per slot against the limit per slot, as lines.
function chart(admitted, refused, limit, from, to) {
  const W = 360, H = 110, PAD = 4;
  let top = limit || 0;
  for (let s = from; s <= to; s++) {
    top = Math.max(top, admitted?.get(s) || 0, refused?.get(s) || 0);
  }
  top = top * 1.1 || 1;
  const x = (s) => PAD + ((s - from) / Math.max(1, to - from)) * (W - 2 * PAD);
  const y = (v) => H - PAD - (v / top) * (H - 2 * PAD);
  const line = (map, cls) => {
    const points = [];
    for (let s = from; s <= to; s++) points.push(x(s).toFixed(1) + ',' + y(map?.get(s) || 0).toFixed(1));
    return svg('polyline', { class: cls, points: points.join(' ') });
  };
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img' });
  g.append(svg('rect', { class: 'frame', x: 0, y: 0, width: W, height: H }));
  if (limit) {
    g.append(svg('line', { class: 'limit', x1: PAD, x2: W - PAD, y1: y(limit), y2: y(limit) }));
  }
  g.append(line(refused, 'refused'), line(admitted, 'admitted'));
  const scale = svg('text', { class: 'scale', x: W - PAD, y: 12, 'text-anchor': 'end' });
  scale.textContent = short(top);
  g.append(scale);
  return g;
}

// One user's card: figures, and the chart of the window.
function card(name, resource, admitted, refused, bucket, slotSeconds, from, to) {
  const limit = bucket ? bucket.rate * slotSeconds : null;
  const last = admitted?.get(to) || 0;
  const inWindow = total(admitted, from, to);
  const refusedInWindow = total(refused, from, to);
  const figures = el('p', { class: 'figures' },
    `last slot ${short(last)}`, limit == null ? ' (no limit)' : ` of ${short(limit)}`,
    ` · ${WINDOW} slots: ${short(inWindow)} admitted, ${short(refusedInWindow)} refused`);
  const article = el('article', {
    class: 'user',
    'data-user': name,
    'data-resource': resource,
    'data-admitted': inWindow,
    'data-refused': refusedInWindow,
    'data-limit-per-slot': limit == null ? '' : limit,
  }, el('h3', {}, usageLink(currentService, name)), figures, chart(admitted, refused, limit, from, to));
  if (bucket) {
    article.append(el('p', { class: 'bucket' },
      `bucket ${short(bucket.level)} of ${short(bucket.capacity)}, ${short(bucket.rate)}/s (${bucket.period})`));
  }
  return article;
}

function resourcesOf(users) {
  const all = new Set();
  for (const resources of Object.values(users || {})) for (const r of Object.keys(resources)) all.add(r);
  return [...all].sort();
}

function picker(service, resources, current) {
  const select = el('select', { 'aria-label': 'resource' });
  for (const r of resources) {
    const option = el('option', { value: r }, r);
    if (r === current) option.selected = true;
    select.append(option);
  }
  select.addEventListener('change', () => { chosen[service] = select.value; refresh(); });
  return select;
}

// The users refused most, over every resource of the service.
function refusalsTable(refused) {
  const rows = [];
  for (const [resource, users] of Object.entries(refused || {})) {
    for (const u of users) if (u.refused > 0) rows.push([u.user, resource, u.refused]);
  }
  rows.sort((a, b) => b[2] - a[2]);
  if (rows.length === 0) return el('p', { class: 'quiet' }, `nobody refused in the last ${WINDOW} slots`);
  const body = el('tbody', {}, ...rows.slice(0, 20).map(([user, resource, n]) =>
    el('tr', { 'data-user': user }, el('td', {}, user), el('td', {}, resource), el('td', { class: 'n' }, short(n)))));
  return el('table', { class: 'refusals' },
    el('thead', {}, el('tr', {}, el('th', {}, 'user'), el('th', {}, 'resource'), el('th', {}, 'refused'))), body);
}

function appsTable(status) {
  const body = el('tbody');
  for (const r of status.resources || []) {
    for (const a of r.apps || []) {
      body.append(el('tr', {}, el('td', {}, r.resource), el('td', {}, a.name), el('td', { class: 'n' }, short(a.guaranteed)),
        el('td', { class: 'n' }, short(a.demand)), el('td', { class: 'n' }, short(a.granted)), el('td', { class: 'n' }, short(a.consumed)),
        el('td', { class: 'n' }, String(a.users))));
    }
  }
  const head = ['resource', 'application', 'guaranteed', 'demand', 'granted', 'consumed', 'users'];
  return el('table', { class: 'apps' }, el('thead', {}, el('tr', {}, ...head.map((h) => el('th', {}, h)))), body);
}

// The resource drawn for `service`: the reader's choice, else requests.
function resourceOf(service, resources) {
  if (chosen[service] && resources.includes(chosen[service])) return chosen[service];
  return resources.includes('requests') ? 'requests' : resources[0];
}

// The service whose cards are being drawn, for their links to usage.
let currentService = '';

function serviceSection(service, heaviest, refused, apps, slotSeconds, to) {
  currentService = service;
  const resources = Object.keys(heaviest).sort();
  const resource = resourceOf(service, resources);
  const from = to - WINDOW + 1;
  const cards = el('div', { class: 'cards' }, ...(heaviest[resource] || []).map((u) => card(u.user, resource,
    bySlot(u.consumption, to), bySlot(u.rejection, to), u.bucket, slotSeconds, from, to)));
  const section = el('section', { class: 'service', 'data-service': service },
    el('h2', {}, service, ' ', picker(service, resources, resource)),
    el('p', { class: 'legend' }, el('span', { class: 'key admitted' }, 'admitted'), ' ',
      el('span', { class: 'key limit' }, 'limit'), ' ', el('span', { class: 'key refused' }, 'refused'),
      ` per slot over the last ${WINDOW} slots (${short(WINDOW * slotSeconds)} s, to slot ${to}),`,
      ` the ${TOP} heaviest users of ${resource}`),
    cards, el('h3', {}, 'Refused'), refusalsTable(refused));
  if (apps) section.append(el('h3', {}, 'Applications'), appsTable(apps));
  return section;
}

function nodesRows(connections) {
  return connections.map((c) => el('tr', { 'data-node': c.node_id },
    el('td', {}, c.node_id), el('td', {}, c.addr || ''), el('td', {}, (c.services || []).join(', ')),
    el('td', { class: 'n' }, `${Math.round(c.connected_seconds)} s`), el('td', { class: 'n' }, String(c.reports)),
    el('td', { class: 'n last', 'data-last-slot': c.last_slot ?? '' }, lastReport(c))));
}

// "slot N, 0.4 s ago": the data slot of the node's last report.
function lastReport(c) {
  if (c.last_slot == null) return 'none yet';
  return `slot ${c.last_slot}, ${c.last_report_seconds.toFixed(1)} s ago`;
}

function role(health) {
  const badge = document.getElementById('role');
  let text = health.role;
  if (health.role === 'standby') text += health.leader_address ? ` (leader ${health.leader_address})` : ' (no leader)';
  if (health.epoch) text += ` · epoch ${health.epoch}`;
  badge.textContent = text;
  badge.dataset.role = health.role;
}

async function refresh() {
  const status = document.getElementById('status');
  try {
    // The heaviest users, as the central ranks them: one question each,
    // however many users it holds.
    const [health, connections, heaviest, refused, apps] = await Promise.all([
      api('/healthz'),
      api('/v1/monitor/connections'),
      api(`/v1/monitor/top?n=${TOP}`),
      api('/v1/monitor/top?n=20&by=refused'),
      api('/v1/monitor/apps'),
    ]);
    role(health);
    const slotSeconds = (health.slot_ms || 1000) / 1000;
    const to = heaviest.to_slot;
    WINDOW = heaviest.slots;
    const services = [...new Set([...Object.keys(heaviest.services), ...Object.keys(refused.services)])].sort();
    const sections = services.map((s) => serviceSection(s, heaviest.services[s] || {}, refused.services[s],
      apps[s], slotSeconds, to));
    if (sections.length === 0) sections.push(el('p', { class: 'quiet' }, 'no consumption reported yet'));
    document.getElementById('services').replaceChildren(...sections);
    document.querySelector('#nodes tbody').replaceChildren(...nodesRows(connections.connections));
    status.textContent = `updated ${new Date().toLocaleTimeString()}, ${connections.connections.length} node streams, slot ${health.slot_ms} ms`;
    status.dataset.state = 'ok';
  } catch (e) {
    status.textContent = String(e.message || e);
    status.dataset.state = 'error';
  }
}

// A user's name that draws their day of usage when clicked.
function usageLink(service, user) {
  const a = el('a', { href: '#', class: 'usage-link' }, user);
  a.addEventListener('click', (e) => {
    e.preventDefault();
    usageOf.service = service;
    usageOf.user = user;
    drawUsage();
  });
  return a;
}

// One resource's day, hour by hour: admitted bars with refused on top.
function hourBars(resource, hours, rows) {
  const W = 480, H = 110, PAD = 4;
  const at = new Map(rows.map((r) => [r.start_s, r]));
  let top = 1;
  for (const h of hours) top = Math.max(top, (at.get(h)?.admitted || 0) + (at.get(h)?.refused || 0));
  const bw = (W - 2 * PAD) / hours.length;
  const y = (v) => (v / (top * 1.1)) * (H - 2 * PAD);
  const g = svg('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img' });
  g.append(svg('rect', { class: 'frame', x: 0, y: 0, width: W, height: H }));
  hours.forEach((h, i) => {
    const r = at.get(h) || { admitted: 0, refused: 0 };
    const x = PAD + i * bw + 1;
    const a = y(r.admitted), f = y(r.refused);
    g.append(svg('rect', { class: 'admitted-bar', x, y: H - PAD - a, width: bw - 2, height: a, 'data-start': h }));
    g.append(svg('rect', { class: 'refused-bar', x, y: H - PAD - a - f, width: bw - 2, height: f }));
  });
  const scale = svg('text', { class: 'scale', x: W - PAD, y: 12, 'text-anchor': 'end' });
  scale.textContent = short(top);
  g.append(scale);
  return g;
}

// The chosen user's usage over the last day, from the usage store.
async function drawUsage() {
  const box = document.getElementById('usage-body');
  const title = document.getElementById('usage-title');
  if (!usageOf.service || !usageOf.user) {
    box.replaceChildren(el('p', { class: 'quiet' }, 'click a user\'s name to draw their last day'));
    return;
  }
  title.textContent = `Usage of ${usageOf.user} in ${usageOf.service}, last 24 hours`;
  const now = Math.floor(Date.now() / 1000);
  const first = Math.floor((now - 86400) / 3600) * 3600 + 3600;
  const hours = [];
  for (let h = first; h <= now; h += 3600) hours.push(h);
  const q = new URLSearchParams({ service: usageOf.service, user: usageOf.user, step: 'hour',
    from: String(first), to: String(now + 1), limit: '10000' });
  let answer;
  try {
    answer = await api('/v1/usage?' + q);
  } catch (e) {
    box.replaceChildren(el('p', { class: 'quiet', 'data-state': 'error' }, String(e.message || e)));
    return;
  }
  const resources = [...new Set(answer.rows.map((r) => r.resource))].sort();
  if (resources.length === 0) {
    box.replaceChildren(el('p', { class: 'quiet' }, 'nothing kept for this user in the last day'));
    return;
  }
  box.replaceChildren(...resources.map((resource) => {
    const rows = answer.rows.filter((r) => r.resource === resource);
    const admitted = rows.reduce((s, r) => s + r.admitted, 0);
    const refused = rows.reduce((s, r) => s + r.refused, 0);
    return el('article', { class: 'usage', 'data-resource': resource, 'data-admitted': admitted,
      'data-refused': refused, 'data-hours': hours.length },
    el('h3', {}, resource), el('p', { class: 'figures' }, `${short(admitted)} admitted, ${short(refused)} refused`),
    hourBars(resource, hours, rows));
  }));
}

refresh();
setInterval(refresh, EVERY_MS);
drawUsage();
setInterval(drawUsage, USAGE_EVERY_MS);
