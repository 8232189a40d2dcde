-- Inline completion for Neovim 0.7 to 0.11, which have no native `vim.lsp.inline_completion`:
-- request `textDocument/inlineCompletion` after a debounce, show the first item as ghost text (extmarks:
-- `virt_text` on the cursor line, `virt_lines` below it), accept, cycle, dismiss. The newest request
-- wins: an older one is cancelled when a newer starts, and a reply for anything but the newest request, or
-- for a buffer or cursor that has changed since, is dropped.
local util = require('rest_lsp.util')

local api = vim.api
local M = {}

local ns = api.nvim_create_namespace('rest_lsp_ghost')
M.namespace = ns

local INVOKED, AUTOMATIC = 1, 2

-- Per buffer: { client_id, timer, seq, pending, items, index, anchor, shown, kind }
local buffers = {}

local opts = { debounce_ms = 150, hl_group = 'RestLspGhost' }
local has_inline = vim.fn.has('nvim-0.10') == 1

-- Counters for tests and :RestLspStats (how many replies were dropped as stale).
M.counters = { requests = 0, replies = 0, stale = 0, shown = 0, accepted = 0, ready = 0 }
-- The request numbers of the last suggestions shown (tests check that only the newest ever shows).
M.history = {}

function M.configure(o)
  opts = vim.tbl_extend('force', opts, o or {})
end

local function cursor()
  local pos = api.nvim_win_get_cursor(0)
  return pos[1] - 1, pos[2] -- 0-based row, byte column
end

function M.hide(bufnr)
  local st = buffers[bufnr]
  if api.nvim_buf_is_valid(bufnr) then
    api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  end
  if st then
    st.shown = nil
  end
end

local function stop_timer(st)
  if st.timer then
    st.timer:stop()
  end
end

local function cancel_pending(st)
  if st.pending then
    local client = vim.lsp.get_client_by_id(st.pending.client_id)
    if client then
      pcall(util.cancel_request, client, st.pending.id)
    end
    st.pending = nil
  end
end

--- Forget the suggestion and any request in flight.
function M.dismiss(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  if not st then
    return
  end
  stop_timer(st)
  cancel_pending(st)
  st.seq = st.seq + 1 -- replies still on their way are now stale
  st.items, st.index, st.anchor = nil, nil, nil
  M.hide(bufnr)
end

-- An LSP range in the item -> 0-based byte positions; no range: at the cursor.
local function item_range(bufnr, item, encoding, row, col)
  local r = item.range
  if type(r) ~= 'table' then
    return row, col, row, col
  end
  local function pos(p)
    local line = api.nvim_buf_get_lines(bufnr, p.line, p.line + 1, false)[1] or ''
    return p.line, util.to_byte_col(line, p.character, encoding)
  end
  local sr, sc = pos(r.start)
  local er, ec = pos(r['end'])
  return sr, sc, er, ec
end

local function item_text(item)
  local t = item.insertText
  if type(t) == 'table' then
    t = t.value -- a snippet: shown and inserted as plain text
  end
  return type(t) == 'string' and t or nil
end

-- The suggestion on screen: ghost text after the typed part, and where the item applies.
local function prepare(bufnr, st, item)
  local row, col = st.anchor.row, st.anchor.col
  local text = item_text(item)
  if not text then
    return nil
  end
  local sr, sc, er, ec = item_range(bufnr, item, st.encoding, row, col)
  if sr ~= row or sc > col then
    return nil -- only ranges that start on the cursor line, at or before the cursor
  end
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  local ghost = util.ghost_text(text, line:sub(sc + 1, col))
  if not ghost then
    return nil
  end
  return { text = text, ghost = ghost, range = { sr, sc, er, ec }, item = item }
end

local function render(bufnr, st)
  M.hide(bufnr)
  local s = st.items and st.items[st.index]
  if not s then
    return
  end
  local lines = util.split_lines(s.ghost)
  local row, col = st.anchor.row, st.anchor.col
  local hl = opts.hl_group
  local first = { { lines[1], hl } }
  if #st.items > 1 then
    table.insert(first, { string.format(' (%d/%d)', st.index, #st.items), 'NonText' })
  end
  local mark = { virt_text = first, hl_mode = 'combine' }
  if has_inline then
    mark.virt_text_pos = 'inline'
  else
    -- 0.7-0.9 have no inline virtual text: overlay the ghost and then the rest of the line after it, so the
    -- line reads as it will after accepting.
    local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
    local rest = line:sub(col + 1)
    if rest ~= '' then
      if #lines > 1 then
        -- the rest of the line moves below the suggestion: show it on the last virtual line, and blank
        -- what the (shorter) first ghost line does not cover
        lines[#lines] = lines[#lines] .. rest
        local pad = vim.fn.strdisplaywidth(rest) - vim.fn.strdisplaywidth(lines[1])
        if pad > 0 then
          table.insert(first, 2, { string.rep(' ', pad), 'Normal' })
        end
      else
        table.insert(first, 2, { rest, 'Normal' })
      end
    end
    mark.virt_text_pos = 'overlay'
  end
  if #lines > 1 then
    local virt_lines = {}
    for i = 2, #lines do
      table.insert(virt_lines, { { lines[i], hl } })
    end
    mark.virt_lines = virt_lines
  end
  api.nvim_buf_set_extmark(bufnr, ns, row, col, mark)
  st.shown = { seq = st.shown_seq, row = row, col = col, ghost = s.ghost, text = s.text, index = st.index,
    item = s.item }
  M.counters.shown = M.counters.shown + 1
  table.insert(M.history, st.shown_seq)
  if #M.history > 50 then
    table.remove(M.history, 1)
  end
end

-- Whether the buffer, its text, the cursor and insert mode are still those of the newest request.
local function at_anchor(bufnr, st)
  local row, col = cursor()
  return api.nvim_get_current_buf() == bufnr and api.nvim_buf_get_changedtick(bufnr) == st.anchor.tick
    and row == st.anchor.row and col == st.anchor.col and api.nvim_get_mode().mode:match('^i') ~= nil
end

local function on_reply(bufnr, st, seq, err, result, want_index)
  if seq ~= st.seq then
    M.counters.stale = M.counters.stale + 1
    return
  end
  st.pending = nil
  M.counters.replies = M.counters.replies + 1
  if err then
    M.last_error = err.message or vim.inspect(err)
    return
  end
  if not result or not api.nvim_buf_is_valid(bufnr) then
    return
  end
  if not at_anchor(bufnr, st) then
    M.counters.stale = M.counters.stale + 1
    return
  end
  local items = {}
  for _, item in ipairs(result.items or result) do
    local s = prepare(bufnr, st, item)
    if s then
      table.insert(items, s)
    end
  end
  st.items = #items > 0 and items or nil
  st.index = st.items and math.min(want_index or 1, #items) or nil
  st.shown_seq = seq
  render(bufnr, st)
  if not st.items and st.ready_seq == seq then
    st.ready_seq = nil
    M.counters.ready = M.counters.ready + 1
    vim.schedule(function()
      M.request(bufnr, st.kind or AUTOMATIC)
    end)
  end
end

--- Ask the server now (kind: 1 Invoked, 2 Automatic).
function M.request(bufnr, kind, want_index)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  local st = buffers[bufnr]
  if not st or M.disabled then
    return
  end
  local client = vim.lsp.get_client_by_id(st.client_id)
  if not client then
    return
  end
  stop_timer(st)
  cancel_pending(st)
  st.seq = st.seq + 1
  local seq = st.seq
  local row, col = cursor()
  local line = api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ''
  st.encoding = client.offset_encoding or 'utf-16'
  st.anchor = { row = row, col = col, tick = api.nvim_buf_get_changedtick(bufnr) }
  st.kind = kind
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = row, character = util.to_lsp_col(line, col, st.encoding) },
    context = { triggerKind = kind },
  }
  M.counters.requests = M.counters.requests + 1
  local ok, id = util.request(client, 'textDocument/inlineCompletion', params, function(err, result)
    on_reply(bufnr, st, seq, err, result, want_index)
  end, bufnr)
  if ok and id then
    st.pending = { client_id = client.id, id = id }
  end
end

--- rest/suggestionReady: the suggestion for an Automatic request answered empty is there now. Ask again
--- (answered from the server's prediction) if that request is still the newest, for this buffer, cursor and
--- text, and nothing is on screen.
function M.on_ready(params)
  local uri = type(params) == 'table' and type(params.textDocument) == 'table' and params.textDocument.uri
  local pos = type(params) == 'table' and params.position
  if type(uri) ~= 'string' or type(pos) ~= 'table' then
    return
  end
  local bufnr = vim.uri_to_bufnr(uri)
  local st = buffers[bufnr]
  if not st or not st.anchor or st.shown or M.disabled or not at_anchor(bufnr, st) then
    return
  end
  local a = st.anchor
  local line = api.nvim_buf_get_lines(bufnr, a.row, a.row + 1, false)[1] or ''
  if pos.line ~= a.row or pos.character ~= util.to_lsp_col(line, a.col, st.encoding) then
    return
  end
  if st.pending then
    st.ready_seq = st.seq -- the notice overtook the (empty) reply: ask again when that comes
    return
  end
  M.counters.ready = M.counters.ready + 1
  M.request(bufnr, st.kind or AUTOMATIC)
end

local function schedule(bufnr)
  local st = buffers[bufnr]
  if not st or M.disabled then
    return
  end
  stop_timer(st)
  st.timer = st.timer or (vim.uv or vim.loop).new_timer()
  st.timer:start(opts.debounce_ms, 0, vim.schedule_wrap(function()
    if api.nvim_buf_is_valid(bufnr) and api.nvim_get_current_buf() == bufnr
      and api.nvim_get_mode().mode:match('^i') then
      M.request(bufnr, AUTOMATIC)
    end
  end))
end

-- Text changed or the cursor moved: the suggestion on screen no longer applies (unless nothing moved).
local function on_change(bufnr)
  local st = buffers[bufnr]
  if not st then
    return
  end
  local row, col = cursor()
  if st.anchor and st.anchor.row == row and st.anchor.col == col
    and st.anchor.tick == api.nvim_buf_get_changedtick(bufnr) then
    return
  end
  M.dismiss(bufnr)
  schedule(bufnr)
end

--- Whether a suggestion is on screen in this buffer.
function M.visible(bufnr)
  local st = buffers[bufnr or api.nvim_get_current_buf()]
  return st ~= nil and st.shown ~= nil
end

--- The suggestion on screen (for tests and statuslines): { seq, row, col, ghost, text, index, count }.
function M.current(bufnr)
  local st = buffers[bufnr or api.nvim_get_current_buf()]
  if not st or not st.shown then
    return nil
  end
  return vim.tbl_extend('force', st.shown, { count = #st.items })
end

--- The number of the newest request made for this buffer.
function M.latest_seq(bufnr)
  local st = buffers[bufnr or api.nvim_get_current_buf()]
  return st and st.seq or 0
end

--- Insert the suggestion on screen; returns false when there is none.
function M.accept(bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  local s = st and st.shown and st.items and st.items[st.index]
  if not s then
    return false
  end
  local sr, sc, er, ec = unpack(s.range)
  local lines = util.split_lines(s.text)
  M.dismiss(bufnr)
  api.nvim_buf_set_text(bufnr, sr, sc, er, ec, lines)
  local last = #lines == 1 and sc + #lines[1] or #lines[#lines]
  api.nvim_win_set_cursor(0, { sr + #lines, last })
  M.counters.accepted = M.counters.accepted + 1
  return true
end

--- Show the next (delta 1) or previous (-1) alternative; asks with an Invoked trigger for more first.
function M.cycle(delta, bufnr)
  bufnr = bufnr or api.nvim_get_current_buf()
  local st = buffers[bufnr]
  if not st then
    return
  end
  if not st.items or (#st.items == 1 and st.kind ~= INVOKED) then
    M.request(bufnr, INVOKED, st.items and 1 + delta or 1)
    return
  end
  st.index = (st.index - 1 + delta) % #st.items + 1
  render(bufnr, st)
end

--- Start serving a buffer with this client.
function M.attach(bufnr, client_id)
  if buffers[bufnr] then
    buffers[bufnr].client_id = client_id
    return
  end
  buffers[bufnr] = { client_id = client_id, seq = 0 }
  local group = api.nvim_create_augroup('rest_lsp_ghost_' .. bufnr, { clear = true })
  api.nvim_create_autocmd({ 'TextChangedI', 'TextChangedP', 'CursorMovedI' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      on_change(bufnr)
    end,
  })
  api.nvim_create_autocmd('InsertEnter', {
    group = group,
    buffer = bufnr,
    callback = function()
      schedule(bufnr)
    end,
  })
  api.nvim_create_autocmd({ 'InsertLeave', 'BufLeave' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.dismiss(bufnr)
    end,
  })
  api.nvim_create_autocmd({ 'BufUnload', 'BufWipeout' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.detach(bufnr)
    end,
  })
  -- The server became ready while the user was already typing here: ask now rather than at the next key.
  if api.nvim_get_current_buf() == bufnr and api.nvim_get_mode().mode:match('^i') then
    schedule(bufnr)
  end
end

function M.detach(bufnr)
  local st = buffers[bufnr]
  if not st then
    return
  end
  M.dismiss(bufnr)
  if st.timer then
    st.timer:close()
  end
  buffers[bufnr] = nil
  pcall(api.nvim_del_augroup_by_name, 'rest_lsp_ghost_' .. bufnr)
end

return M
