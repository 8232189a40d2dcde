-- A minimal Neovim configuration for the ghost-text capture (capture.sh) and for trying the plugin:
--   REST_LSP_MODEL=/path/to/model nvim --clean -u editors/neovim/demo/init.lua some_file.py
local here = vim.fn.fnamemodify(debug.getinfo(1, 'S').source:sub(2), ':p:h')
vim.opt.runtimepath:prepend(vim.fn.fnamemodify(here, ':h'))
vim.o.swapfile = false
vim.o.number = true
vim.o.laststatus = 2
vim.o.expandtab = true
vim.o.shiftwidth = 4
local model = vim.env.REST_LSP_MODEL
local cmd = vim.env.REST_LSP_CMD and vim.split(vim.env.REST_LSP_CMD, ' ', { trimempty = true }) or nil
require('rest_lsp').setup({
  cmd = cmd,
  init_options = {
    model = (model and model ~= '') and model or vim.NIL, -- nil: the embedded Qwen2.5-Coder-0.5B
    maxTokens = 48,
    maxLines = 4,
    -- a CPU shared with other work needs more than the server's default 1.5 s for a multi-line suggestion
    timeBudgetMs = tonumber(vim.env.REST_LSP_TIME_BUDGET_MS or '') or 10000,
  },
})
vim.cmd('highlight RestLspGhost ctermfg=244 guifg=#808080')
