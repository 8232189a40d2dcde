-- `rest/cursor`: tells the server where the cursor rests, so it can warm its KV cache there before the next
-- keystroke asks for a completion. Both inline completion paths (native 0.12+ and rest_lsp.ghost) use it.
-- A buffer's cursor is reported once it has rested `rest_ms` after moving (normal or insert mode) or after
-- the buffer was entered; every report waits for such a rest, so a buffer is never reported twice within
-- `rest_ms`. Written against Neovim 0.7's API.
local util = require('rest_lsp.util')

local api = vim.api
local uv = vim.uv or vim.loop
local M = {}

M.rest_ms = 250
-- Reports sent so far, and the last few ({ uri, line, character, at = uv.now() }), for tests and :RestLspStats.
M.sent = 0
M.history = {}

local timers = {} -- bufnr -> uv timer
local enabled = function()
  return true
end
local client_for = function(_)
  return nil
end

--- opts.enabled(): whether completions are on; opts.client(bufnr): the rest-lsp client serving the buffer.
function M.configure(opts)
  enabled = opts.enabled or enabled
  client_for = opts.client or client_for
end

local function report(bufnr)
  -- The cursor is read when the rest is over: it is where the user stopped, in the buffer still shown.
  if not enabled() or not api.nvim_buf_is_valid(bufnr) or api.nvim_get_current_buf() ~= bufnr then
    return
  end
  local client = client_for(bufnr)
  if not client then
    return
  end
  local pos = api.nvim_win_get_cursor(0)
  local line = api.nvim_buf_get_lines(bufnr, pos[1] - 1, pos[1], false)[1] or ''
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(bufnr) },
    position = { line = pos[1] - 1, character = util.to_lsp_col(line, pos[2], client.offset_encoding or 'utf-16') },
  }
  util.notify(client, 'rest/cursor', params)
  M.sent = M.sent + 1
  table.insert(M.history, { uri = params.textDocument.uri, line = params.position.line,
    character = params.position.character, at = uv.now() })
  if #M.history > 20 then
    table.remove(M.history, 1)
  end
end

--- The cursor moved or the buffer was entered: report it once it rests.
function M.schedule(bufnr)
  local t = timers[bufnr]
  if t then
    t:stop()
  end
  if not enabled() then
    return
  end
  if not t then
    t = uv.new_timer()
    timers[bufnr] = t
  end
  t:start(M.rest_ms, 0, vim.schedule_wrap(function()
    report(bufnr)
  end))
end

--- Drop every pending report (completions turned off).
function M.cancel_all()
  for _, t in pairs(timers) do
    t:stop()
  end
end

function M.attach(bufnr)
  if timers[bufnr] then
    M.schedule(bufnr) -- a restarted server: the buffer becomes active for it
    return
  end
  local group = api.nvim_create_augroup('rest_lsp_cursor_' .. bufnr, { clear = true })
  api.nvim_create_autocmd({ 'CursorMoved', 'CursorMovedI', 'BufEnter' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.schedule(bufnr)
    end,
  })
  api.nvim_create_autocmd({ 'BufUnload', 'BufWipeout' }, {
    group = group,
    buffer = bufnr,
    callback = function()
      M.detach(bufnr)
    end,
  })
  -- Attached while shown: the buffer becomes active for this server now.
  M.schedule(bufnr)
end

function M.detach(bufnr)
  local t = timers[bufnr]
  if t then
    t:stop()
    t:close()
  end
  timers[bufnr] = nil
  pcall(api.nvim_del_augroup_by_name, 'rest_lsp_cursor_' .. bufnr)
end

return M
