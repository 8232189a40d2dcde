-- Helpers without editor state: LSP position encodings and the `rest/stats` report.
-- Written against Neovim 0.7's Lua API (no vim.str_utfindex encodings argument, no vim.iter).
local M = {}

local islist = vim.islist or vim.tbl_islist

-- Client methods: `client.request(...)` up to 0.10, `client:request(...)` from 0.11 (the dot form is
-- deprecated there).
local colon = vim.fn.has('nvim-0.11') == 1

function M.request(client, method, params, handler, bufnr)
  if colon then
    return client:request(method, params, handler, bufnr)
  end
  return client.request(method, params, handler, bufnr)
end

function M.notify(client, method, params)
  if colon then
    return client:notify(method, params)
  end
  return client.notify(method, params)
end

function M.cancel_request(client, id)
  if colon then
    return client:cancel_request(id)
  end
  return client.cancel_request(id)
end

function M.stop(client)
  if colon then
    return client:stop()
  end
  return client.stop()
end

-- Length in UTF-16 code units (or UTF-32 code points) of the first `byte_col` bytes of `line`.
local function units(line, byte_col, encoding)
  local n, i = 0, 1
  while i <= byte_col do
    local b = line:byte(i)
    local len = (b >= 0xF0 and 4) or (b >= 0xE0 and 3) or (b >= 0xC0 and 2) or 1
    n = n + ((encoding == 'utf-16' and len == 4) and 2 or 1)
    i = i + len
  end
  return n
end

--- Byte column (0-based) -> LSP character offset in `encoding` ('utf-8', 'utf-16', 'utf-32').
function M.to_lsp_col(line, byte_col, encoding)
  if encoding == 'utf-8' then
    return byte_col
  end
  return units(line, math.min(byte_col, #line), encoding)
end

--- LSP character offset in `encoding` -> byte column (0-based), clamped to the line.
function M.to_byte_col(line, character, encoding)
  if encoding == 'utf-8' then
    return math.min(character, #line)
  end
  local n, i = 0, 1
  while i <= #line and n < character do
    local b = line:byte(i)
    local len = (b >= 0xF0 and 4) or (b >= 0xE0 and 3) or (b >= 0xC0 and 2) or 1
    n = n + ((encoding == 'utf-16' and len == 4) and 2 or 1)
    i = i + len
  end
  return i - 1
end

function M.split_lines(text)
  local lines = {}
  for s in (text .. '\n'):gmatch('(.-)\r?\n') do
    table.insert(lines, s)
  end
  return lines
end

--- What an item shows as ghost text at the cursor, or nil when it does not continue what is typed.
--- `typed` is the buffer text from the item's range start to the cursor.
function M.ghost_text(insert_text, typed)
  if insert_text:sub(1, #typed) ~= typed then
    return nil
  end
  local rest = insert_text:sub(#typed + 1)
  if rest == '' then
    return nil
  end
  return rest
end

local function fmt_value(v)
  if type(v) == 'number' and v ~= math.floor(v) then
    return string.format('%.3f', v)
  elseif v == vim.NIL or v == nil then
    return '-'
  elseif type(v) == 'table' then
    return vim.inspect(v, { newline = ' ', indent = '' })
  end
  -- one buffer line each: a value with line breaks (a completion's raw text) shows them escaped
  return (tostring(v):gsub('\n', '\\n'))
end

local function sorted_keys(t)
  local keys = vim.tbl_keys(t)
  table.sort(keys, function(a, b)
    return tostring(a) < tostring(b)
  end)
  return keys
end

--- `rest/stats` as lines: totals, the datastore, and the most recent request.
function M.format_stats(stats)
  local lines = {}
  if type(stats) ~= 'table' then
    return { 'rest/stats: ' .. fmt_value(stats) }
  end
  local function section(name, t)
    if type(t) ~= 'table' then
      table.insert(lines, name .. ': ' .. fmt_value(t))
      return
    end
    table.insert(lines, name .. ':')
    for _, k in ipairs(sorted_keys(t)) do
      local v = t[k]
      if type(v) == 'table' and not islist(v) then
        table.insert(lines, '  ' .. k .. ':')
        for _, k2 in ipairs(sorted_keys(v)) do
          table.insert(lines, '    ' .. k2 .. ': ' .. fmt_value(v[k2]))
        end
      else
        table.insert(lines, '  ' .. k .. ': ' .. fmt_value(v))
      end
    end
  end
  for _, k in ipairs(sorted_keys(stats)) do
    if k == 'recent' and type(stats.recent) == 'table' then
      table.insert(lines, string.format('recent: %d requests', #stats.recent))
      if #stats.recent > 0 then
        section('last request', stats.recent[#stats.recent])
      end
    else
      section(k, stats[k])
    end
  end
  return lines
end

return M
