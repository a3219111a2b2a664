#include "src/io/reward_model_file.h"

#include <vector>

#include "src/io/parameter_file.h"

namespace rlf {

namespace {

std::vector<ExtraTensor> head_tensors(RewardModel<float>& model) {
  RewardHead<float>& head = model.head();
  return {{"reward_head.weight", head.d_model(), head.parameters()},
          {"reward_head.bias", 1, head.parameters() + head.d_model()}};
}

}  // namespace

void save_reward_model(const std::string& path, RewardModel<float>& model) {
  save_parameters(path, model.config(), model.body().layout(), model.body().parameters(),
                  ParameterFileKind::RewardModel, head_tensors(model));
}

void load_reward_model(const std::string& path, RewardModel<float>& model) {
  load_parameters(path, model.body().layout(), model.body().parameters(),
                  ParameterFileKind::RewardModel, head_tensors(model));
}

}  // namespace rlf
