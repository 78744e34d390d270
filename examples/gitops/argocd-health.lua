-- Argo CD health check for grpo.dev/GRPOJob, driven by the operator's status.conditions (and phase as fallback).
-- Healthy: training finished (Succeeded). Progressing: waiting, running, restarting after a failure, or waiting
-- for nodes. Degraded: Failed, Rejected (the spec is invalid; the message says how to fix it), or CreateFailed
-- (the API server refuses the pods: quota, PodSecurity…; retried until it accepts them).
-- Stalled (no step past its deadline and runPolicy.onStall is Ignore, or the stacks are being dumped) is
-- Degraded; once the gang restarts it is Progressing.
-- Suspended: spec.runPolicy.suspend is true. A started job that today's rules refuse (SpecInvalid, after an operator
-- upgrade) keeps its health: running, the warning is added to the message.
local hs = {}
local st = obj.status
if st == nil or (st.phase == nil and st.conditions == nil) then
  hs.status = "Progressing"
  hs.message = "Waiting for the grpo-operator to pick up the job"
  return hs
end
local gen = obj.metadata.generation
if st.observedGeneration ~= nil and gen ~= nil and st.observedGeneration < gen then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(gen)
  return hs
end
local conds = {}
if st.conditions ~= nil then
  for _, c in ipairs(st.conditions) do
    conds[c.type] = c
  end
end
local function is_true(t)
  return conds[t] ~= nil and conds[t].status == "True"
end
local function msg(t, default)
  local c = conds[t]
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    return c.message
  end
  if st.message ~= nil and st.message ~= "" then
    return st.message
  end
  return default
end
local progress = ""
if st.progress ~= nil and st.progress.display ~= nil then
  progress = " (step " .. st.progress.display .. ")"
end
if is_true("Succeeded") or st.phase == "Succeeded" then
  hs.status = "Healthy"
  hs.message = msg("Succeeded", "Training finished")
elseif is_true("Failed") or st.phase == "Failed" then
  hs.status = "Degraded"
  hs.message = msg("Failed", "Training failed")
elseif is_true("Rejected") or st.phase == "Rejected" then
  hs.status = "Degraded"
  hs.message = msg("Rejected", "The GRPOJob spec is invalid")
elseif is_true("Suspended") or st.phase == "Suspended" then
  hs.status = "Suspended"
  hs.message = msg("Suspended", "Suspended")
elseif is_true("Restarting") or st.phase == "Restarting" then
  hs.status = "Progressing"
  hs.message = msg("Restarting", "Restarting after a failure")
elseif is_true("Stalled") then
  hs.status = "Degraded"
  hs.message = msg("Stalled", "No training progress")
elseif is_true("CreateFailed") then
  hs.status = "Degraded"
  hs.message = msg("CreateFailed", "The API server refuses to create the job's pods")
elseif is_true("Unschedulable") then
  hs.status = "Progressing"
  hs.message = msg("Unschedulable", "Waiting for nodes")
elseif is_true("Queued") then
  hs.status = "Progressing"
  hs.message = msg("Queued", "Waiting for Kueue to admit the pods")
elseif is_true("Running") or st.phase == "Running" then
  hs.status = "Progressing"
  hs.message = msg("Running", "Training") .. progress
  if is_true("SpecInvalid") then
    hs.message = hs.message .. "; " .. msg("SpecInvalid", "today's rules refuse the spec")
  end
else
  hs.status = "Progressing"
  hs.message = msg("Created", "Pending")
end
return hs
