-- rest-lsp for Neovim: starts `rest-lsp --stdio` for each project root and shows its inline completions.
-- Neovim 0.12+: the native `vim.lsp.inline_completion`. Neovim 0.7-0.11: rest_lsp.ghost (same idea, in Lua).
--
--   require('rest_lsp').setup({ init_options = { model = '/path/to/model' } })
local util = require('rest_lsp.util')
local ghost = require('rest_lsp.ghost')
local cursor = require('rest_lsp.cursor')

local api = vim.api
local M = {}

local DOCS = 'docs/editors.md (section Neovim) of rest-lsp'

M.defaults = {
  cmd = nil, -- nil: $VIRTUAL_ENV/bin/rest-lsp, then rest-lsp on PATH
  filetypes = nil, -- nil: every file buffer
  root_markers = { '.git', 'pyproject.toml', 'setup.py', 'package.json', 'Cargo.toml', 'go.mod', '.hg' },
  init_options = {}, -- the server's settings (camelCase): model, device, precision, corpus, draftBudget, ...
  native = nil, -- nil: the native inline completion when Neovim has it (0.12+); false: always the Lua one
  debounce_ms = 150,
  hl_group = 'RestLspGhost',
  keymaps = { accept = '<Tab>', next = '<M-]>', prev = '<M-[>', dismiss = '<C-]>' },
}

M.config = vim.deepcopy(M.defaults)
local clients = {} -- root dir -> client id
M.enabled = true

local function native()
  if M.config.native == false then
    return false
  end
  return vim.lsp.inline_completion ~= nil
end

local function is_executable(path)
  return path ~= nil and path ~= '' and vim.fn.executable(path) == 1
end

--- The server command: the configured one, else rest-lsp from an activated virtualenv or PATH.
function M.server_cmd()
  if M.config.cmd then
    return M.config.cmd
  end
  local venv = vim.env.VIRTUAL_ENV
  if venv and is_executable(venv .. '/bin/rest-lsp') then
    return { venv .. '/bin/rest-lsp', '--stdio' }
  end
  local exe = vim.fn.exepath('rest-lsp')
  if exe ~= '' then
    return { exe, '--stdio' }
  end
  return nil
end

local function find_root(bufnr)
  local name = api.nvim_buf_get_name(bufnr)
  local dir = name ~= '' and vim.fn.fnamemodify(name, ':p:h') or vim.fn.getcwd()
  while dir and dir ~= '' do
    for _, marker in ipairs(M.config.root_markers) do
      if (vim.uv or vim.loop).fs_stat(dir .. '/' .. marker) then
        return dir
      end
    end
    local parent = vim.fn.fnamemodify(dir, ':h')
    if parent == dir then
      break
    end
    dir = parent
  end
  return vim.fn.getcwd()
end

local function map(bufnr, lhs, fn, fallback, desc)
  if not lhs or lhs == '' then
    return
  end
  vim.keymap.set('i', lhs, function()
    if not fn() and fallback then
      api.nvim_feedkeys(api.nvim_replace_termcodes(lhs, true, false, true), 'n', false)
    end
  end, { buffer = bufnr, silent = true, desc = desc })
end

local function set_keymaps(bufnr)
  local k = M.config.keymaps or {}
  if native() then
    map(bufnr, k.accept, function()
      return vim.lsp.inline_completion.get()
    end, true, 'rest-lsp: accept the inline completion')
    map(bufnr, k.next, function()
      vim.lsp.inline_completion.select({ count = 1 })
      return true
    end, false, 'rest-lsp: next inline completion')
    map(bufnr, k.prev, function()
      vim.lsp.inline_completion.select({ count = -1 })
      return true
    end, false, 'rest-lsp: previous inline completion')
    return
  end
  map(bufnr, k.accept, function()
    return ghost.accept(bufnr)
  end, true, 'rest-lsp: accept the inline completion')
  map(bufnr, k.next, function()
    ghost.cycle(1, bufnr)
    return true
  end, false, 'rest-lsp: next inline completion')
  map(bufnr, k.prev, function()
    ghost.cycle(-1, bufnr)
    return true
  end, false, 'rest-lsp: previous inline completion')
  map(bufnr, k.dismiss, function()
    local shown = ghost.visible(bufnr)
    ghost.dismiss(bufnr)
    return shown
  end, true, 'rest-lsp: dismiss the inline completion')
end

local function on_attach(client, bufnr)
  if native() then
    vim.lsp.inline_completion.enable(M.enabled, { bufnr = bufnr })
  else
    ghost.attach(bufnr, client.id)
  end
  cursor.attach(bufnr)
  set_keymaps(bufnr)
end

local function client_config(root, cmd)
  local config = {
    name = 'rest_lsp',
    cmd = cmd,
    root_dir = root,
    workspace_folders = { { uri = vim.uri_from_fname(root), name = root } },
    init_options = M.config.init_options,
    on_attach = on_attach,
    flags = { debounce_text_changes = 50 },
  }
  if not native() then
    -- An Automatic request the server could not answer in time (the prompt still computing) is followed by
    -- rest/suggestionReady once the suggestion is there: the Lua ghost text asks again if nothing moved.
    -- (The native inline completion of 0.12+ offers no way to ask from here.)
    config.capabilities = vim.tbl_deep_extend('force', vim.lsp.protocol.make_client_capabilities(),
      { experimental = { restLsp = { suggestionReady = true } } })
    config.handlers = {
      ['rest/suggestionReady'] = function(_, result)
        ghost.on_ready(result)
      end,
    }
  end
  return config
end

--- Attach rest-lsp to a buffer (started by the FileType autocommand; callable by hand).
function M.attach(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  if vim.bo[bufnr].buftype ~= '' or api.nvim_buf_get_name(bufnr) == '' then
    return
  end
  local ft = vim.bo[bufnr].filetype
  if M.config.filetypes and not vim.tbl_contains(M.config.filetypes, ft) then
    return
  end
  local cmd = M.server_cmd()
  if not cmd or not is_executable(cmd[1]) then
    if not M._warned then
      M._warned = true
      vim.notify('rest-lsp: the `rest-lsp` server was not found (set cmd in setup(), activate its virtualenv, '
        .. 'or put it on PATH). See ' .. DOCS .. '.', vim.log.levels.ERROR)
    end
    return
  end
  local root = find_root(bufnr)
  if vim.lsp.start then
    -- 0.8+: reuses the running client of this name and root
    clients[root] = vim.lsp.start(client_config(root, cmd), { bufnr = bufnr })
    return clients[root]
  end
  local id = clients[root]
  if not id or not vim.lsp.get_client_by_id(id) then
    id = vim.lsp.start_client(client_config(root, cmd))
    clients[root] = id
  end
  if id then
    vim.lsp.buf_attach_client(bufnr, id)
  end
  return id
end

--- The rest-lsp client serving a buffer.
function M.client(bufnr)
  bufnr = (bufnr == nil or bufnr == 0) and api.nvim_get_current_buf() or bufnr
  -- get_clients: 0.10+; buf_get_clients: 0.7-0.11
  local list = vim.lsp.get_clients and vim.lsp.get_clients({ bufnr = bufnr }) or vim.lsp.buf_get_clients(bufnr)
  for _, c in pairs(list or {}) do
    if c.name == 'rest_lsp' then
      return c
    end
  end
end

--- Ask the server for `rest/stats`; callback(err, stats).
function M.stats(callback, bufnr)
  local client = M.client(bufnr)
  if not client then
    callback('rest-lsp is not attached to this buffer', nil)
    return
  end
  util.request(client, 'rest/stats', {}, function(err, result)
    callback(err, result)
  end, bufnr or 0)
end

--- :RestLspStats: the statistics in a scratch window.
function M.show_stats()
  M.stats(function(err, stats)
    if err then
      vim.notify('rest-lsp: ' .. (type(err) == 'table' and (err.message or vim.inspect(err)) or tostring(err)),
        vim.log.levels.ERROR)
      return
    end
    local lines = util.format_stats(stats)
    table.insert(lines, string.format('neovim client: %d cursor reports (rest/cursor)', cursor.sent))
    if not native() then
      local c = ghost.counters
      table.insert(lines, string.format('neovim client: %d requests, %d replies, %d stale dropped, %d shown, %d accepted',
        c.requests, c.replies, c.stale, c.shown, c.accepted))
      if ghost.last_error then
        table.insert(lines, 'last error: ' .. ghost.last_error)
      end
    end
    vim.cmd('botright new')
    local buf = api.nvim_get_current_buf()
    api.nvim_buf_set_lines(buf, 0, -1, false, lines)
    vim.bo[buf].buftype = 'nofile'
    vim.bo[buf].bufhidden = 'wipe'
    vim.bo[buf].modifiable = false
    pcall(api.nvim_buf_set_name, buf, 'rest-lsp://stats')
  end)
end

--- Turn inline completions on or off (all buffers).
function M.toggle(on)
  if on == nil then
    on = not M.enabled
  end
  M.enabled = on
  if not on then
    cursor.cancel_all()
  end
  if native() then
    vim.lsp.inline_completion.enable(on)
  else
    ghost.disabled = not on
    if not on then
      for _, b in ipairs(api.nvim_list_bufs()) do
        ghost.dismiss(b)
      end
    end
  end
  vim.notify('rest-lsp: inline completions ' .. (on and 'on' or 'off'))
end

function M.restart()
  local ids = {}
  for root, id in pairs(clients) do
    ids[#ids + 1] = id
    clients[root] = nil
  end
  for _, id in ipairs(ids) do
    local c = vim.lsp.get_client_by_id(id)
    if c then
      util.stop(c)
    end
  end
  vim.defer_fn(function()
    for _, b in ipairs(api.nvim_list_bufs()) do
      if api.nvim_buf_is_loaded(b) then
        M.attach(b)
      end
    end
  end, 500)
end

--- Rebuild the workspace index, through the server's command for it (workspace/executeCommand).
function M.rebuild_index()
  local client = M.client()
  local commands = client and client.server_capabilities and client.server_capabilities.executeCommandProvider
  commands = commands and commands.commands or {}
  for _, name in ipairs(commands) do
    if name:match('[Rr]ebuild') or name:match('[Rr]eindex') then
      util.request(client, 'workspace/executeCommand', { command = name, arguments = {} }, function() end)
      vim.notify('rest-lsp: rebuilding the workspace index')
      return
    end
  end
  vim.notify('rest-lsp: this server offers no index rebuild command', vim.log.levels.WARN)
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  if opts and opts.keymaps == false then
    M.config.keymaps = {}
  end
  ghost.configure({ debounce_ms = M.config.debounce_ms, hl_group = M.config.hl_group })
  cursor.configure({
    enabled = function()
      return M.enabled
    end,
    client = M.client,
  })
  vim.cmd('highlight default link RestLspGhost Comment')

  api.nvim_create_user_command('RestLspStats', M.show_stats, { desc = 'rest-lsp: show rest/stats' })
  api.nvim_create_user_command('RestLspToggle', function()
    M.toggle()
  end, { desc = 'rest-lsp: toggle inline completions' })
  api.nvim_create_user_command('RestLspRestart', M.restart, { desc = 'rest-lsp: restart the server' })
  api.nvim_create_user_command('RestLspRebuildIndex', M.rebuild_index, { desc = 'rest-lsp: rebuild the index' })

  local group = api.nvim_create_augroup('rest_lsp', { clear = true })
  api.nvim_create_autocmd('FileType', {
    group = group,
    pattern = M.config.filetypes or '*',
    callback = function(args)
      M.attach(args.buf)
    end,
  })
  for _, b in ipairs(api.nvim_list_bufs()) do
    if api.nvim_buf_is_loaded(b) and vim.bo[b].filetype ~= '' then
      M.attach(b)
    end
  end
end

return M
