-- rlfusion Lmod modulefile. Relocatable: it finds its prefix from its own path.
--   installed (make install PREFIX=P):  module use P/share/modulefiles; module load rlfusion
--   from a checkout (after make):       module use CHECKOUT/jobs/modulefiles; module load rlfusion
-- Sets PATH (the rlfusion binary), RLFUSION_ROOT (the prefix), RLFUSION_INPUTS (models, tasks,
-- run configs: bare --model/--task names resolve there) and RLFUSION_JOBS (the batch scripts and
-- their function library). Sites add their MPI/HDF5 modules with depends_on() below.
help([[rlfusion: RL post-training of Mixture-of-Experts models with MPI (Slurm, PBS).
Batch scripts: $RLFUSION_JOBS/slurm/cpu.sbatch, gpu.sbatch; $RLFUSION_JOBS/pbs/cpu.pbs, gpu.pbs.
Documentation: $RLFUSION_ROOT/share/doc/rlfusion/CLUSTER.md]])
whatis("Name: rlfusion")
whatis("Version: " .. myModuleVersion())
whatis("Description: RL post-training of MoE models (RL Fusion, StaleSync, DistQueue) with MPI")
family("rlfusion")

local file = myFileName()
local checkout = file:match("^(.*)/jobs/modulefiles/[^/]+/[^/]+$")
local prefix = file:match("^(.*)/share/modulefiles/[^/]+/[^/]+$")
if checkout then
  prepend_path("PATH", pathJoin(checkout, "build/src"))
  setenv("RLFUSION_ROOT", checkout)
  setenv("RLFUSION_INPUTS", pathJoin(checkout, "inputs"))
  setenv("RLFUSION_JOBS", pathJoin(checkout, "jobs"))
elseif prefix then
  prepend_path("PATH", pathJoin(prefix, "bin"))
  setenv("RLFUSION_ROOT", prefix)
  setenv("RLFUSION_INPUTS", pathJoin(prefix, "share/rlfusion/inputs"))
  setenv("RLFUSION_JOBS", pathJoin(prefix, "share/rlfusion/jobs"))
else
  LmodError("rlfusion modulefile: expected under PREFIX/share/modulefiles/rlfusion/ or " ..
            "CHECKOUT/jobs/modulefiles/rlfusion/, found at " .. file)
end
-- depends_on("openmpi", "hdf5")   -- the site's modules rlfusion was built with
